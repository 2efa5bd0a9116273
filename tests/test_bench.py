"""The benchmark scripts still import and set up against today's API (they are run by hand, not by CI)."""
import importlib
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the bench scripts, one about 25 s

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py"))


@pytest.fixture(autouse=True)
def bench_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))


@pytest.mark.parametrize("name", SCRIPTS)
def test_bench_script_imports(name):
    module = importlib.import_module(name)
    if name != "results":
        assert callable(module.main)


def test_analysis_bench_makes_the_demos_pairs_and_one_template_behind_one_prefix(tmp_path):
    analysis = importlib.import_module("analysis")
    demo = analysis.make_data(tmp_path / "demo", analysis.CASES["demo"][1])
    lines = demo.read_text().splitlines()
    assert len(lines) > 24  # the demo keeps about half of its 96 candidates
    one = [json.loads(x) for x in analysis.make_data(tmp_path / "one", analysis.CASES["shared-prefix"][1])
           .read_text().splitlines()]
    assert len(one) > 24 and {r["template"] for r in one} == {"add-eq-1"}

"""The benchmark scripts still import and set up against today's API (they are run by hand, not by CI)."""
import importlib
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


def test_analysis_bench_makes_the_demos_pairs(tmp_path):
    analysis = importlib.import_module("analysis")
    data = analysis.demo_data(tmp_path)
    lines = data.read_text().splitlines()
    assert len(lines) > 24  # the demo keeps about half of its 96 candidates

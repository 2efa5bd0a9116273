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


def test_reproduce_row_matches_rows_by_key_and_names_the_items_that_differ(tmp_path):
    from keyheads.evaluation.cache import ResultCache

    reproduce = importlib.import_module("reproduce_row")
    compare, latest = reproduce.compare, reproduce.latest_by_key
    run, fresh = ResultCache(tmp_path / "run.sqlite"), ResultCache(tmp_path / "fresh.sqlite")
    run.add([{"key": "a", "variant": "run label", "id": "q/0", "output": " 12"},
             {"key": "b", "variant": "run label", "id": "q/1", "output": " 7"},
             {"key": "b", "variant": "run label", "id": "q/1", "output": " 8"}])  # the latest row of a key wins
    fresh.add([{"key": "a", "variant": "cli label", "id": "q/0", "output": " 12"},
               {"key": "b", "variant": "cli label", "id": "q/1", "output": " 7"},
               {"key": "c", "variant": "cli label", "id": "q/2", "output": " 3"}])
    found = compare(latest(tmp_path / "fresh.sqlite"), latest(tmp_path / "run.sqlite"))
    assert found == {"items": 3, "in_run": 2, "identical": 1, "differ": ["q/1"]}
    assert latest(tmp_path / "missing.sqlite") == {}


def test_table1_pairs_items_and_tests_them_with_the_exact_binomial(tmp_path):
    paired = importlib.import_module("table1").paired
    # base wrong on a, b, c; the row wrong on c, d: gained a and b, lost d
    gained, lost, p = paired({"a", "b", "c"}, {"c", "d"})
    assert (gained, lost) == (2, 1)
    # two-sided exact binomial, written out: P(X <= 1) + P(X >= 2) of Binomial(3, 1/2) = 1
    assert p == pytest.approx(1.0)
    gained, lost, p = paired(set("abcdefgh"), set())  # 8 gained, none lost: 2 * (1/2)^8
    assert (gained, lost) == (8, 0) and p == pytest.approx(2 / 256)
    assert paired({"x"}, {"x"}) == (0, 0, 1.0)

"""The scripts of bench/ (speed and memory) and studies/ (findings) still import and set up against today's API
(they are run by hand, not by CI), as modules of the packages bench and studies, with no import circle in bench/."""
import ast
import datetime
import importlib
import itertools
import json
import re
import subprocess
from pathlib import Path

import pytest

from bench import analysis, results
from studies import first_token_heads, reproduce_row, seed_band, study_results, table1

pytestmark = pytest.mark.slow  # runs the bench and study scripts, one about 25 s

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = (ROOT / "bench", ROOT / "studies")
MODULES = sorted(f"{folder.name}.{p.stem}" for folder in FOLDERS for p in folder.glob("*.py") if p.stem != "__init__")
# what the scripts share and run nothing themselves: a section of a RESULTS file, the floors, the tiny mode, the
# paper config's setup, a table
HELPERS = ("bench.results", "bench.floors", "bench.tiny", "bench.paper_gpu_setup", "studies.study_results",
           "studies.findings")


@pytest.mark.parametrize("name", MODULES)
def test_script_imports(name):
    module = importlib.import_module(name)
    if name not in HELPERS:
        assert callable(module.main)


def bench_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) of every `from bench.X import Y` and `import bench.X` in a file, in functions too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "bench":
            found += [(f"bench.{a.name}", None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench."):
            found += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.startswith("bench.")]
    return found


def test_the_scripts_run_as_modules_of_two_packages_and_change_no_import_path():
    for folder in FOLDERS:
        assert (folder / "__init__.py").read_text().startswith('"""'), folder
        for path in folder.glob("*.py"):
            assert "sys.path" not in path.read_text(), f"{path.name}: import as a package, not through sys.path"


def test_every_bench_import_names_what_its_module_has_even_inside_a_function():
    """The GPU parts import inside functions, where no CPU run reaches: each name must still exist."""
    for path in (ROOT / "bench").glob("*.py"):
        for module, name in bench_imports(path):
            assert name is None or hasattr(importlib.import_module(module), name), f"{path.name}: {module}.{name}"


def circles(graph: dict[str, set[str]]) -> list[str]:
    """The modules of `graph` (module -> the modules it imports) that reach themselves."""
    def reached(start: str) -> set[str]:
        seen, todo = set(), list(graph.get(start, ()))
        while todo:
            if (m := todo.pop()) not in seen:
                seen.add(m)
                todo += graph.get(m, ())
        return seen

    return sorted(m for m in graph if m in reached(m))


def test_bench_has_no_import_circle():
    graph = {f"bench.{p.stem}": {m for m, _ in bench_imports(p)} for p in (ROOT / "bench").glob("*.py")}
    assert circles(graph) == []
    # the check sees one: results imported back by a module that imports it
    assert {"bench.patching", "bench.results"} <= set(circles({**graph, "bench.results": {"bench.patching"}}))


def test_write_section_replaces_or_adds_one_section_and_keeps_the_index_in_step(tmp_path):
    path = tmp_path / "RESULTS.md"
    results.write_section("Speed: a (bench/a.py)", "first", path)
    results.write_section("Memory, b", "second", path)
    results.write_section("Speed: a (bench/a.py)", "first, again", path)
    assert path.read_text() == (
        results.HEADER + "\nSections:\n\n- [Speed: a (bench/a.py)](#speed-a-benchapy)\n- [Memory, b](#memory-b)\n\n"
        "## Speed: a (bench/a.py)\n\nfirst, again\n\n## Memory, b\n\nsecond\n")
    assert results.with_index(path.read_text()) == path.read_text()


def test_bench_results_indexes_its_sections():
    text = results.RESULTS.read_text()
    assert results.with_index(text) == text


def test_provenance_names_the_checkouts_commit_and_marks_uncommitted_changes(tmp_path):
    repo, plain = tmp_path / "repo", tmp_path / "plain"
    (repo / "bench").mkdir(parents=True)
    plain.mkdir()

    def git(*args):
        settings = ["-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false"]
        return subprocess.run(["git", *settings, *args], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()

    def line(script="bench/a.py"):
        return results.provenance(script, "CPU, 2 threads", root=repo)

    git("init", "-q")
    (repo / "bench" / "a.py").write_text("x = 1\n")
    (repo / "bench" / "RESULTS.md").write_text("# results\n")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    sha = git("rev-parse", "--short", "HEAD")
    today = datetime.date.today().isoformat()

    def expect(commit, script="bench/a.py"):
        return f"- script: {script}; commit {commit}, run {today}; machine: CPU, 2 threads"

    assert line("bench/a.py --flag") == expect(sha, "bench/a.py --flag")
    (repo / "bench" / "RESULTS.md").write_text("# results, rewritten by a run\n")  # not a change of the code
    (repo / "notes.txt").write_text("outside src/ and bench/\n")
    assert line() == expect(sha)
    (repo / "bench" / "a.py").write_text("x = 2\n")
    assert line() == expect(f"{sha} + uncommitted changes")
    git("commit", "-q", "-am", "second")
    second = git("rev-parse", "--short", "HEAD")
    assert second != sha and line() == expect(second)
    (repo / "src").mkdir()
    (repo / "src" / "new.py").write_text("")  # a new file under src/ counts too
    assert line() == expect(f"{second} + uncommitted changes")
    assert "; commit unknown (not a git checkout), run" in results.provenance("bench/a.py", "m", root=plain)


def test_every_bench_results_section_opens_with_its_provenance_line():
    text = results.RESULTS.read_text()
    sections = re.split(r"^## .+$", text, flags=re.M)[1:]
    titles = re.findall(r"^## (.+)$", text, flags=re.M)
    for title, body in zip(titles, sections):
        if "(bench/paper_gpu.py)" in title:
            continue  # written by bench/paper_gpu.py from its GPU records; not under this rule yet
        lines = body.strip().splitlines()  # the first bullet, with its indented continuation lines
        if lines[0].startswith("<!-- bench record:"):  # a section written from its record: its text opens after
            lines = lines[1:]
        first = " ".join([lines[0], *(x.strip() for x in itertools.takewhile(lambda x: x.startswith("  "), lines[1:]))])
        opening = r"- script: .+; (figures committed in|figures withdrawn|not measured|commit) .+; machine: .+"
        assert re.fullmatch(opening, first), title


def test_a_study_script_prints_its_section_and_writes_no_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study_results.show_section("A finding", "body")
    assert capsys.readouterr().out == "## A finding\n\nbody\n" and list(tmp_path.iterdir()) == []


def test_analysis_bench_makes_the_demos_pairs_and_one_template_behind_one_prefix(tmp_path):
    demo = analysis.make_data(tmp_path / "demo", analysis.CASES["demo"][1])
    lines = demo.read_text().splitlines()
    assert len(lines) > 24  # the demo keeps about half of its 96 candidates
    one = [json.loads(x) for x in analysis.make_data(tmp_path / "one", analysis.CASES["shared-prefix"][1])
           .read_text().splitlines()]
    assert len(one) > 24 and {r["template"] for r in one} == {"add-eq-1"}


def test_reproduce_row_matches_rows_by_key_and_names_the_items_that_differ(tmp_path):
    from keyheads.evaluation.cache import ResultCache

    reproduce = reproduce_row
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


def test_reproduce_row_from_an_eval_folder_repeats_its_settings(tmp_path):
    reproduce = reproduce_row
    adapter, evaluated = tmp_path / "full", tmp_path / "eval"
    adapter.mkdir()
    evaluated.mkdir()
    from tests.report.handmade import finetune_result

    record = finetune_result("full", None, 1, 1.0).model_copy(update={"base_model": "qwen2.5-coder-1.5b"})
    (adapter / "finetune.json").write_text(json.dumps(record.to_json()))
    config = {"benchmarks": ["arith-mul", "generic-kl"], "data_dir": "/data", "limit": 50, "batch_size": 16,
              "few_shot": None, "seed": 3, "split": "full", "cache_dir": str(tmp_path / "cache")}
    (evaluated / "results.json").write_text(json.dumps({"config": config, "variants": []}))
    got_adapter, settings, benches, limit, cache, title = reproduce.from_eval(adapter, evaluated)
    assert (got_adapter, benches, limit, cache) == (adapter, ["arith-mul", "generic-kl"], 50, tmp_path / "cache")
    assert "qwen2.5-coder-1.5b full" in title
    cmd = reproduce.eval_command(adapter, settings, ["arith-mul"], 50, tmp_path / "fresh", tmp_path / "out", 2)
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert {k: flags[k] for k in ("--split", "--data-dir", "--batch-size", "--seed", "--threads")} == {
        "--split": "full", "--data-dir": "/data", "--batch-size": "16", "--seed": "3", "--threads": "2"}
    assert "--few-shot" not in flags and cmd[:4] == ["keyheads", "eval", "--adapter", str(adapter)]


def test_table1_tests_every_row_against_the_base_item_by_item_with_holm_over_the_table(tmp_path):
    from keyheads.report.rundata import eval_table
    from keyheads.report.stats import holm
    from keyheads.runfolder import RunFolder

    from tests.report.test_stats import fake_eval

    run = RunFolder(fake_eval(tmp_path))
    lines, family = table1.paired_table(run, eval_table(run))
    assert family == 8 and lines[0] == "| Variant | GSM8K | MMLU |"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    # the random@40 row: 6 of the base row's 26 wrong items right, none lost; Holm over all 8 tests
    raw = [2 / 2**18, 2 / 64, 1.0, 1.0, 1.0, 1.0, 0.0625, 0.5]  # ko gsm8k, r gsm8k, r mmlu, s1 x2, s2 gsm8k, s2/ko mmlu
    assert "+6 / -0, Δ +12.0 [+3.0, +20.4], p 0.031 (Holm 0.22)" in rows["m + random@40 SFT"]
    assert f"(Holm {sorted(holm(raw))[1]:.2g})" == "(Holm 0.22)"
    assert "+0 / -18, Δ -36.0" in rows["m - 10 key heads knocked out"]
    # three seeds of random@40: the band of their Δ on GSM8K (+12, -4, 0) and MMLU (0, 0, -10)
    assert rows["m + random@40 SFT: 3 seeds, Δ"].split(" | ")[1:] == [
        "mean +2.7, range -4.0 to +12.0 over 3 seeds", "mean -3.3, range -10.0 to +0.0 over 3 seeds |"]


def test_first_token_heads_compares_two_effects_files_as_a_direct_computation(tmp_path):
    import numpy as np
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    a = -rng.random((3, 4)) / 10
    b = a + rng.normal(0, 0.02, (3, 4))
    b[2, 1] = -0.5  # the largest effect of b, at 2.1
    paths = []
    for name, heads in (("a", a), ("b", b)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"metric": "relative-logit", "method": "path", "model": "m", "n_samples": 5,
                                    "n_excluded": 0, "data_sha256": "", "heads": heads.tolist(), "mlps": [0.0] * 3}))
        paths.append(path)
    found = first_token_heads.compare(*paths, ks=(3, 12))
    top = {k: [sorted(((l, h) for l in range(3) for h in range(4)), key=lambda lh: m[lh])[:k] for m in (a, b)]
           for k in (3, 12)}
    assert found["top"] == {k: tuple(v) for k, v in top.items()}
    assert found["overlap"] == {3: len(set(top[3][0]) & set(top[3][1])), 12: 12}
    rho, p = spearmanr(a.ravel(), b.ravel())
    assert found["rho"] == pytest.approx(rho) and found["p"] == pytest.approx(p) and found["n_heads"] == 12
    assert found["largest"][1] == ((2, 1), -0.5)
    assert found["largest"][0] == (top[3][0][0], a[top[3][0][0]])


def test_first_token_heads_tabulates_both_sets_knockout_curves():
    from keyheads.results.knockout import KnockoutCurves

    k = list(range(0, 21))
    curves = {way: KnockoutCurves(k=k, effect_rank=[0.9 - 0.01 * i * (1 + j) for i in k], random_rank=[],
                                  random_mean=[0.9 - 0.002 * i for i in k], random_std=[0.001 * i for i in k],
                                  effect_order=[])
              for j, way in enumerate(("single-token", "first-token"))}
    table = first_token_heads.curves_table(curves).splitlines()
    assert table[0] == "| | k = 0 | k = 2 | k = 6 | k = 10 | k = 20 |"
    assert table[2] == "| single-token: top-k | 90.0% | 88.0% | 84.0% | 80.0% | 70.0% |"
    assert table[5] == "| first-token: random-k | 90.0% | 89.6 ± 0.2% | 88.8 ± 0.6% | 88.0 ± 1.0% | 86.0 ± 2.0% |"
    words = first_token_heads.curves_summary(curves).replace("\n", " ")
    assert "single-token answers the top-k curve lies below the random band (mean - std) at every k from 1" in words
    assert "the top 10 cost -11.1% relative, 10 random heads -2.2%" in words  # 0.80 / 0.90 and 0.88 / 0.90


def seed_folder(root, control_wrong: dict, n: int = 50, kl: float = 0.05):
    """A `keyheads eval` folder: the base row, then one seed of a control, with per-item wrong ids."""
    from keyheads.results.evaluation import BenchmarkSummary, EvalResults, VariantResult
    from keyheads.runfolder import variant_slug

    base_wrong = {"gsm8k": range(0, 26), "mmlu": range(0, 20)}
    rows = {"m": base_wrong, "m - knockout (10 heads, global mean)": control_wrong}  # a label its folder renames
    variants = []
    for label, sets in rows.items():
        folder = root / variant_slug(label)
        folder.mkdir(parents=True)
        summaries = {bench: BenchmarkSummary(n=n, correct=n - len(ids), accuracy=1 - len(ids) / n)
                     for bench, ids in sets.items()}
        summaries["generic-kl"] = BenchmarkSummary(kl=0.0 if label == "m" else kl, n=n)
        for bench, ids in sets.items():
            (folder / f"{bench}.wrong.jsonl").write_text("".join(json.dumps({"id": f"q{i}"}) + "\n" for i in ids))
        for bench, summary in summaries.items():
            (folder / f"{bench}.json").write_text(json.dumps(summary.to_json()))
        variants.append(VariantResult(label=label, benchmarks=summaries))
        (folder / "summary.json").write_text(json.dumps(variants[-1].to_json()))
    results = EvalResults(config={"benchmarks": [*base_wrong, "generic-kl"]}, variants=variants)
    (root / "results.json").write_text(json.dumps(results.to_json()))
    return root


def test_seed_band_is_the_mean_and_range_over_seeds_with_each_measured_seed_tested_against_the_base(tmp_path):
    from keyheads.report.stats import holm, mcnemar_p

    band = seed_band
    one = seed_folder(tmp_path / "s1", {"gsm8k": range(0, 36), "mmlu": range(0, 20)}, kl=0.04)  # gsm8k -20 points
    two = seed_folder(tmp_path / "s2", {"gsm8k": range(4, 26), "mmlu": range(0, 24)}, kl=0.06)  # +8, -8
    zero = seed_folder(tmp_path / "s0", {"gsm8k": range(0, 25), "mmlu": range(0, 20)}, kl=0.05)  # +2 points
    seeds, tests, base = {}, {}, {}
    for label, folder in (("seed 0", zero), ("seed 1", one), ("seed 2", two)):
        base, seeds[label], tests[label] = band.measured(folder)
    assert base == {"gsm8k": 48.0, "mmlu": 60.0}
    assert seeds["seed 1"] == {"gsm8k": 28.0, "mmlu": 60.0, "generic-kl": 0.04}
    out = band.table(seeds, base, tests)
    gsm8k = next(line for line in out.splitlines() if line.startswith("| gsm8k"))
    assert "| 50 | 28 | 56 |" in gsm8k  # the three seeds
    assert "-3.3 [-20, +8] (3 seeds)" in gsm8k  # (2 - 20 + 8) / 3 and the range
    # s0 gsm8k, s0 mmlu, s1 gsm8k, s1 mmlu, s2 gsm8k, s2 mmlu
    p = [mcnemar_p(1, 0), mcnemar_p(0, 0), mcnemar_p(0, 10), mcnemar_p(0, 0), mcnemar_p(4, 0), mcnemar_p(0, 4)]
    assert "+0 / -10, Δ -20.0" in gsm8k and f"(Holm {band.fmt_p(holm(p)[2])})" in gsm8k
    assert "| generic KL from base | 0 | 0.050 | 0.040 | 0.060 | 0.050 [0.040, 0.060] |" in out


def test_first_token_heads_says_when_a_top_k_curve_never_drops_below_its_band():
    from keyheads.results.knockout import KnockoutCurves

    k = list(range(0, 7))  # curves that stop short of k = 10 are read at their last k
    flat = KnockoutCurves(k=k, effect_rank=[0.9] * 7, random_rank=[], random_mean=[0.9] * 7, random_std=[0.01] * 7,
                          effect_order=[])
    words = first_token_heads.curves_summary({"first-token": flat}).replace("\n", " ")
    assert "lies at no k below the random band (mean - std); the top 6 cost +0.0% relative, 6 random heads" in words

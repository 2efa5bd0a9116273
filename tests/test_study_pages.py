"""The study pages are rendered from the committed records, and only from them: the pages in the repository are
what `python -m studies.pages` gives now; a changed number in a record makes them stale, and rewriting them puts
the new number in; every committed study record has its page; a record with an evaluation gets tables 1 and 2
whose accuracies are the record's."""
import json
import shutil
from pathlib import Path

import pytest

from keyheads.io import write_json
from keyheads.runfolder import RunFolder
from studies import pages

from .report.handmade import make_run

ROOT = Path(__file__).resolve().parents[1]
BENCH_RECORDS = ("paper-llama2-7b-gpu",)  # GPU speed and memory records: bench/RESULTS.md renders them


def test_the_committed_pages_are_what_the_records_give():
    stale = pages.stale_pages()
    assert stale == [], f"run python -m studies.pages: {[str(p.relative_to(ROOT)) for p in stale]}"


def test_every_committed_study_record_is_listed_and_every_listed_record_is_committed():
    manifest = json.loads((ROOT / "studies" / "studies.json").read_text())
    listed = {s["record"] for s in manifest["studies"] if s["record"] is not None}
    committed = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "records").glob("*/*/record.json")
                 if (p.parent / "run").is_dir() and p.parent.parent.name not in BENCH_RECORDS}
    committed |= {str(p.parent.parent.relative_to(ROOT)) for p in (ROOT / "records").glob("*/cells/*/record.json")}
    assert listed == committed
    for name in BENCH_RECORDS:
        assert f"records/{name}/" in (ROOT / "bench" / "RESULTS.md").read_text()


def _copy_tree(tmp: Path, only: str | None = None) -> Path:
    """The files pages.py reads and writes, copied under tmp; with `only`, a manifest of that one study (its pages,
    README's and RESULTS' findings tables, then written once for it: the whole manifest takes minutes a run)."""
    for rel in ("README.md", "studies/RESULTS.md", "studies/studies.json", "studies/verdict_changes.json"):
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp / rel)
    shutil.copytree(ROOT / "studies" / "pages", tmp / "studies" / "pages")
    manifest = json.loads((ROOT / "studies" / "studies.json").read_text())
    if only is not None:
        manifest["studies"] = [s for s in manifest["studies"] if s["name"] == only]
        manifest["models"] = [m for m in manifest["models"] if m["study"] == only]  # the findings table's columns
        write_json(tmp / "studies" / "studies.json", manifest)
        for page in (tmp / "studies" / "pages").glob("*.md"):
            if page.stem != only:
                page.unlink()
    for study in manifest["studies"]:
        if study["record"] is not None:
            shutil.copytree(ROOT / study["record"], tmp / study["record"])
    if only is not None:
        assert pages.main([], root=tmp) == 0
    return tmp


def test_a_changed_number_in_a_record_makes_the_pages_stale_and_rewriting_puts_it_in(tmp_path):
    root = _copy_tree(tmp_path, only="demo-smollm2-135m")
    assert pages.main(["--check"], root=root) == 0
    [record] = (root / "records" / "demo-smollm2-135m").iterdir()
    path = record / "run" / "knockout" / "knockout.json"
    data = json.loads(path.read_text())
    before = data["key_heads"]["accuracy_before"]
    data["key_heads"]["accuracy_after"] = 0.5
    path.write_text(json.dumps(data))
    assert pages.main(["--check"], root=root) == 1
    page = root / "studies" / "pages" / "demo-smollm2-135m.md"
    assert "to 50.0%." not in page.read_text()
    assert pages.main([], root=root) == 0 and pages.main(["--check"], root=root) == 0
    assert f"accuracy goes from {100 * before:.1f}% to 50.0%." in page.read_text()
    # the findings table of both pages changed with it
    for rel in ("README.md", "studies/RESULTS.md"):
        assert f"{100 * before:.1f}% → 50.0%" in (root / rel).read_text()


def test_a_page_of_no_study_is_stale_and_removed(tmp_path):
    root = _copy_tree(tmp_path, only="demo-smollm2-135m")
    (root / "studies" / "pages" / "gone.md").write_text("# a study that left the manifest\n")
    assert pages.main(["--check"], root=root) == 1
    assert pages.main([], root=root) == 0 and not (root / "studies" / "pages" / "gone.md").exists()


def test_a_record_with_an_evaluation_gets_tables_1_and_2_with_its_accuracies(tmp_path):
    run = make_run(tmp_path / "rec" / "run", True)
    write_json(tmp_path / "rec" / "record.json", {"study": "hand-made", "commit": "0" * 40, "command": "made by hand"})
    text = pages.page({"title": "Hand-made", "record": "rec"}, root=tmp_path)
    assert "## Tables 1 and 2" in text and "made by: `made by hand`" in text
    assert "the knockout row is keyheads' addition" in text
    for name, info in RunFolder(run).finetune_records.items():  # each variant's loss curve, from its record
        losses = info.train.losses
        lr = info.config.lr
        heads = [] if info.components is None else [(h.layer, h.head) for h in info.components.heads]
        spread = f"{len(heads)} in {len(set(layer for layer, _ in heads))} layers" if heads else "-"
        assert (f"| {name} | {info.method} | {'-' if lr is None else format(lr, 'g')} | {spread} | "
                f"{info.tuned_params:,} |") in text
        assert f"| {losses[0]:.3f} | {min(losses):.3f} | {losses[-1]:.3f} |" in text
    mlp, att = RunFolder(run).mlp_record, RunFolder(run).attention_record
    assert mlp is not None and att is not None
    assert f"are {mlp.turning_points.start}-{mlp.turning_points.inflection}-{mlp.turning_points.end};" in text
    for label in att.labels:
        assert f"| {label.head} | {label.label} | {label.lean} | {label.operand_A_plus_B:.3f} |" in text
    table = RunFolder(run).eval_record
    assert table is not None
    for variant in table.variants:  # every row's accuracy on every benchmark, as the record has it
        for bench, summary in variant.benchmarks.items():
            if summary.accuracy is None:  # the drift row has a KL, no accuracy
                continue
            assert f"{100 * summary.accuracy:.1f} [" in text, (variant.label, bench)


def test_a_listed_record_that_is_not_there_is_a_clear_error(tmp_path):
    root = _copy_tree(tmp_path)
    manifest = json.loads((root / "studies" / "studies.json").read_text())
    manifest["studies"][0]["record"] = "records/gone/2026-01-01"
    (root / "studies" / "studies.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="records/gone/2026-01-01.*not a committed record"):
        pages.main(["--check"], root=root)


def test_a_first_token_study_compares_its_key_heads_with_the_study_it_is_against(tmp_path):
    import numpy as np
    from scipy.stats import spearmanr

    from keyheads.effects import Effects

    rng = np.random.default_rng(1)
    single_fx = -rng.random((4, 8)) / 5
    first_fx = single_fx + rng.normal(0, 0.03, (4, 8))
    tasks = {"single": ["addition"] * 3, "first": ["addition", "addition", "multiplication", "multiplication"]}
    for name, fx in (("single", single_fx), ("first", first_fx)):
        run = make_run(tmp_path / name / "run", True)
        write_json(tmp_path / name / "record.json", {"study": name, "commit": "0" * 40, "command": "by hand"})
        write_json(run / "identify" / "effects.json", Effects(
            metric="relative-logit", method="path", model="hand-made", n_samples=50, n_excluded=0, data_sha256=None,
            heads=fx.tolist(), mlps=[0.0] * 4).to_json())
        (run / "pairs.jsonl").write_text("".join(
            json.dumps({"reference": f"{i} + 1 = ", "counterfactual": f"{i} @ 1 = ", "answer": str(i + 1),
                        "task": t}) + "\n" for i, t in enumerate(tasks[name])))
    manifest = {"studies": [{"name": "single", "title": "S", "record": "single"},
                            {"name": "first", "title": "F", "record": "first", "against": "single"}]}
    text = pages.page(manifest["studies"][1], root=tmp_path, manifest=manifest)
    assert "## Against single-token answers" in text and "study `single`" in text
    heads = [(l, h) for l in range(4) for h in range(8)]
    top = [set(sorted(heads, key=lambda lh: fx[lh])[:10]) for fx in (single_fx, first_fx)]
    assert f"Overlap of the top 10: {len(top[0] & top[1])} of 10; of the top 32: 32 of 32." in text
    rho = spearmanr(single_fx.ravel(), first_fx.ravel())[0]
    assert f"Spearman rank correlation of the 32 head effects: rho {rho:.3f}" in text
    (ls, hs), (lf, hf) = (min(heads, key=lambda lh: fx[lh]) for fx in (single_fx, first_fx))
    assert (f"| largest effect (most negative) | {100 * single_fx[ls, hs]:+.1f}% ({ls}.{hs}) | "
            f"{100 * first_fx[lf, hf]:+.1f}% ({lf}.{hf}) |") in text
    past = [int((fx < -0.05).sum()) for fx in (single_fx, first_fx)]
    assert f"| heads past the paper's -5% | {past[0]} | {past[1]} |" in text
    assert "| single-token | 3 | 0 | 3 |" in text and "| first-token | 2 | 2 | 4 |" in text
    assert "| first-token: top-k | 80.0% |" in text  # each side's knockout curves, from its own record
    # its other side pending: the page says so instead of comparing
    manifest["studies"][0]["record"] = None
    assert "waits for the record of study `single`" in pages.page(manifest["studies"][1], tmp_path, manifest)

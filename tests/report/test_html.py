"""report.html from a real (tiny) run folder: sections in the paper's order, every figure inline as a PNG,
nothing fetched from anywhere, the numbers shown equal to those in the JSON, findings that can go
either way, and a note instead of a crash for every stage that did not run."""
import base64
import json
import re
import shutil

import pytest
import torch

from keyheads.io import file_sha256
from keyheads.report.findings import VERDICTS, Finding, findings
from keyheads.report.html import render, write_html_report
from keyheads.report.markup import PNG_SIGNATURE

from .handmade import make_run
from .page import section_text, table_rows

ORDER = ["identify", "knockout", "transfer", "attention", "mlp", "improve", "findings", "manifest"]


def read(path):
    return json.loads(path.read_text())


def test_sections_in_the_papers_order(report):
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<h1>keyheads run: tiny-llama</h1>" in page
    at = [page.index(f'<section id="{a}">') for a in ORDER]
    assert at == sorted(at)
    for heading in (
        "figure 2",
        "figure 3",
        "figure 4",
        "figure 5",
        "figure 6",
        "tables 1 and 2",
        "Findings",
        "Manifest",
    ):
        assert re.search(rf"<h2>[^<]*{heading}[^<]*</h2>", page), heading
    assert not any("did not run" in section_text(page, a) for a in ORDER[:6])  # every stage ran


def test_every_image_is_an_inline_png_and_nothing_is_fetched(report, run_folder):
    page = report.read_text()
    sources = re.findall(r'<img[^>]*\ssrc="([^"]*)"', page)
    for src in sources:
        assert src.startswith("data:image/png;base64,"), src[:80]
        assert base64.b64decode(src.split(",", 1)[1], validate=True).startswith(PNG_SIGNATURE)
    # the loss chart is drawn by the report from finetune.json's numbers; every other figure is a file
    drawn = re.findall(r'<img src="([^"]*)" alt="training loss per optimizer step', page)
    assert len(drawn) == 1
    sources = [s for s in sources if s not in drawn]
    pngs = sorted(run_folder.rglob("*.png"))
    assert len(sources) == len(pngs) >= 8  # heatmap, curves, 3+ attention, 3 MLP figures: all of them
    embedded = {base64.b64decode(s.split(",", 1)[1]) for s in sources}
    assert embedded == {p.read_bytes() for p in pngs}
    assert not re.search(r"https?://", page, re.I) and "file:/" not in page
    # no other kind of reference either: every src/href is a data URI or an in-page anchor
    for attr in re.findall(r'\s(?:src|href)="([^"]*)"', page):
        assert attr.startswith(("data:", "#")), attr
    assert "<script src" not in page and 'rel="stylesheet"' not in page


def test_numbers_shown_are_the_json_numbers(report, run_folder):
    page = report.read_text()
    keys = read(run_folder / "identify" / "key_heads.json")
    rows = table_rows(page, "key-heads")
    assert [r[1][1] for r in rows] == [k["label"] for k in keys["heads"]]
    assert [float(r[4][0]) for r in rows] == [k["effect"] for k in keys["heads"]]
    assert [r[4][1] for r in rows] == [f"{100 * k['effect']:+.2f}%" for k in keys["heads"]]

    ko = read(run_folder / "knockout" / "knockout.json")["key_heads"]
    headline = section_text(page, "knockout")
    assert f"accuracy {100 * ko['accuracy_before']:.1f}% → {100 * ko['accuracy_after']:.1f}%" in headline
    curves = read(run_folder / "knockout" / "knockout.json")["curves"]
    assert [float(r[2][0]) for r in table_rows(page, "curves")] == curves["effect_rank"]
    assert [float(r[3][0]) for r in table_rows(page, "curves")] == pytest.approx(curves["random_mean"], abs=0)

    labels = read(run_folder / "attention" / "attention.json")["labels"]
    assert [(r[0][1], r[1][1]) for r in table_rows(page, "labels")] == [
        (f"{l['head']['layer']}.{l['head']['head']}", l["label"]) for l in labels
    ]

    results = read(run_folder / "eval" / "results.json")["variants"]
    table1 = {r[0][1]: r for r in table_rows(page, "table1")}
    assert list(table1) == [v["label"] for v in results]
    for v in results:
        for j, bench in enumerate(("addsub", "mmlu")):
            acc = v["benchmarks"][bench]["accuracy"]
            assert float(table1[v["label"]][4 + 2 * j][0]) == acc
            assert table1[v["label"]][4 + 2 * j][1].startswith(f"{100 * acc:.1f}%")
    for name in ("precise-top3", "precise-top1-mlp", "full"):
        info = read(run_folder / "finetune" / name / "finetune.json")
        row = table1[f"tiny-llama + {name}"]
        assert int(row[3][0]) == info["tuned_params"]  # tuned params joined from finetune.json
        assert float(row[2][0]) == info["train"]["samples_per_second"]
    assert table1["tiny-llama"][2][1] == "–"  # the base model was not trained

    tp = read(run_folder / "mlp" / "mlp.json")["turning_points"]
    assert f"{tp['start']}–{tp['inflection']}–{tp['end']}" in section_text(page, "mlp")


def test_table2_only_when_the_ablation_ran(report, run_folder, tmp_path):
    rows = table_rows(report.read_text(), "table2")
    assert [r[0][1] for r in rows] == ["precise-top1-mlp", "precise-top3"]
    assert "Training loss" in report.read_text() and 'alt="training loss per optimizer step' in report.read_text()
    copy = shutil.copytree(run_folder, tmp_path / "run")
    shutil.rmtree(copy / "finetune" / "precise-top1-mlp")
    assert "Table 2" not in render(copy) and "Table 1" in render(copy)


def verdicts(run) -> list[str]:
    return [f.verdict for f in findings(run)]


@pytest.mark.parametrize("holds", [True, False])
def test_the_findings_section_shows_each_verdict_with_its_evidence(tmp_path, holds):
    """Rendering only: which verdict each rule gives is tests/report/test_verdict_rules.py's, on golden cases."""
    items = findings(make_run(tmp_path / "run", holds))
    assert len(items) == 11 and [f.row for f in items] == list(range(1, 12))
    measured = [f for f in items if f.verdict != "not measured"]
    assert measured and all(f.evidence and any(c.isdigit() for c in f.evidence) and f.rule and f.key
                            for f in measured)
    page = write_html_report(tmp_path / "run").read_text()
    badge = {"holds": "held", "partly": "partly", "does not hold": "failed"}
    for verdict, css in badge.items():
        assert page.count(f'class="badge {css}"') == verdicts(tmp_path / "run").count(verdict), verdict
    assert ("holds" in verdicts(tmp_path / "run")) == holds


def test_findings_of_the_tiny_run_and_of_an_empty_folder(run_folder, tmp_path):
    items = findings(run_folder)
    assert all(isinstance(f, Finding) and f.verdict in VERDICTS for f in items)
    assert items[0].verdict != "not measured" and items[4].verdict != "not measured"  # identify and attention ran
    (tmp_path / "empty").mkdir()
    assert verdicts(tmp_path / "empty") == ["not measured"] * 11


def test_missing_stages_say_so(run_folder, tmp_path):
    copy = shutil.copytree(run_folder, tmp_path / "run")
    for stage in ("knockout", "mlp", "eval", "finetune"):
        shutil.rmtree(copy / stage)
    page = render(copy)
    for anchor, stage in (("knockout", "knockout"), ("transfer", "knockout"), ("mlp", "mlp"), ("improve", "eval")):
        assert f"The {stage} stage did not run" in section_text(page, anchor), anchor
    assert "did not run" not in section_text(page, "identify") + section_text(page, "attention")
    empty = tmp_path / "empty"
    empty.mkdir()
    page = write_html_report(empty).read_text()
    for anchor in ORDER[:6]:
        assert "did not run" in section_text(page, anchor), anchor
    assert "not recorded" in section_text(page, "manifest")


def test_manifest(report, run_folder, tmp_path):
    page = section_text(report.read_text(), "manifest")
    record = read(run_folder / "stages" / "data.json")
    assert record["outputs"]["pairs.jsonl"] == file_sha256(run_folder / "pairs.jsonl")
    assert record["outputs"]["pairs.jsonl"] in page and "matches the file" in page
    assert torch.__version__ in page and record["settings"]["fingerprint"] in page
    assert f"{read(run_folder / 'model.json')['fingerprint']} (model.json, stages/data.json" in page
    records = {r["stage"]: r for r in map(read, (run_folder / "stages").glob("*.json"))}
    assert "finetune/full" in records  # nested stage names are stored as finetune--full.json
    stages = table_rows(report.read_text(), "stages")
    assert {r[0][1] for r in stages} == set(records)
    assert all(float(r[1][0]) == records[r[0][1]]["seconds"] for r in stages)
    assert [r[0][1] for r in table_rows(report.read_text(), "config")] == list(read(run_folder / "config.json"))

    # without stage records nothing is made up: the versions are "not recorded", not this interpreter's
    copy = shutil.copytree(run_folder, tmp_path / "run")
    shutil.rmtree(copy / "stages")
    shutil.rmtree(copy / "finetune")
    (copy / "pairs.jsonl").write_text((copy / "pairs.jsonl").read_text() + "\n{}\n")
    page = section_text(render(copy), "manifest")
    versions = table_rows(render(copy), "versions")
    assert [r[1][1] for r in versions] == ["not recorded"] * 5 and torch.__version__ not in page
    assert "DIFFERS" in page  # effects.json's recorded hash no longer matches the edited pairs file


def test_written_atomically(report, run_folder):
    assert report == run_folder / "report.html"
    assert not [p for p in run_folder.iterdir() if p.name.startswith(".report.html.")]
    with pytest.raises(FileNotFoundError):
        write_html_report(run_folder / "nowhere")


def test_text_from_the_data_is_escaped_everywhere(tmp_path):
    """Autoescape: a model name, a head label and a claim's evidence with markup in them stay text."""
    import json

    run = make_run(tmp_path / "run", True)
    evil = '<img src=x onerror="alert(1)"> & see https://example.org'
    (run / "config.json").write_text(json.dumps({"model": evil, "seed": 0}))
    keys = json.loads((run / "identify" / "key_heads.json").read_text())
    keys["heads"][0]["label"] = "<b>0.0</b>"
    (run / "identify" / "key_heads.json").write_text(json.dumps(keys))
    page = render(run)
    assert "<img src=x" not in page and "<b>0.0</b>" not in page and "https://" not in page
    assert (
        "<h1>keyheads run: &lt;img src=x onerror=&quot;alert(1)&quot;&gt; &amp; see https&#58;//example.org</h1>"
        in page
    )
    assert [r[1][1] for r in table_rows(page, "key-heads")][0] == "<b>0.0</b>"  # shown as the text it is
    assert page.count('<div class="table-box"><table class="sortable') == page.count("<table")


def _wrong_items(run, labels_acc: dict[str, dict[str, float]], n: int = 100) -> None:
    """eval/<row>/<benchmark>.wrong.jsonl for each row: the first (1 - accuracy) * n items wrong."""
    from keyheads.io import write_jsonl
    from keyheads.runfolder import RunFolder

    folder = RunFolder(run)
    for label, accs in labels_acc.items():
        for bench, acc in accs.items():
            write_jsonl(folder.eval_wrong(label, bench), ({"id": f"{bench}/{i}"} for i in range(round((1 - acc) * n))))


@pytest.mark.parametrize("holds", [True, False])
def test_findings_give_the_item_by_item_tests_and_name_single_random_draws(tmp_path, holds):
    """The claims that rest on accuracies quote each row against the base row item by item (Δ with its
    interval, raw and Holm p); a claim against one random draw says so; the held/not-held calls are unchanged."""
    from keyheads.report.rundata import eval_table, paired_family
    from keyheads.runfolder import RunFolder

    run = make_run(tmp_path / "run", holds)
    assert "Not tested item by item" in findings(run)[10].evidence  # row 11, before the per-item files
    assert all(f.verdict == "not measured" for f in findings(run)[6:9:2] + findings(run)[10:])  # rows 7, 9, 11
    data = read(run / "eval" / "results.json")
    _wrong_items(run, {v["label"]: {b: s["accuracy"] for b, s in v["benchmarks"].items()} for v in data["variants"]})
    items = findings(run)
    assert items[6].verdict != "not measured" and items[10].verdict != "not measured"  # the per-item files decide
    pairs = paired_family(RunFolder(run), eval_table(RunFolder(run)))
    assert len(pairs) == 3 * 2  # knockout, precise, full against the base, on GSM8K and MMLU
    by_claim = {f.claim: f.evidence for f in items}
    generic = next(e for c, e in by_claim.items() if c.startswith("Without the key heads"))
    ko_gsm8k = pairs[("knockout", "gsm8k")]  # 20% -> 5%: 15 of 100 items lost
    assert (ko_gsm8k.gained, ko_gsm8k.lost) == (0, 15)
    assert f"GSM8K {ko_gsm8k.cell()}" in generic and f"Holm over the table's {len(pairs)} tests" in generic
    math_claim = next(e for c, e in by_claim.items() if c.startswith("Precise SFT of the key heads improves"))
    assert f"precise-top2 — GSM8K {pairs[('precise', 'gsm8k')].cell()}" in math_claim
    assert f"full — GSM8K {pairs[('full', 'gsm8k')].cell()}" in math_claim
    assert "(Holm " in math_claim and "Δ " in math_claim
    transfer = next(e for c, e in by_claim.items() if c.startswith("The key heads matter on arithmetic"))
    assert "(single random draw)" in transfer  # the transfer control is one set of random heads
    knockout = next(e for c, e in by_claim.items() if c.startswith("Knocking out the key heads"))
    assert "(2 random draws)" in knockout  # the handmade curves have 2 random orderings
    page = write_html_report(run).read_text()
    assert f"{len(pairs)} tests of this table" in section_text(page, "improve")
    assert [r[0][1] for r in table_rows(page, "pairs")] == ["knockout", "precise", "full"]


def _add_tuned_row(run, name: str, finetune: dict, gsm8k: float) -> None:
    """A fine-tuned variant `name` added to the hand-made run: its finetune.json and its eval row (MMLU 50%)."""
    (run / "finetune" / name).mkdir(parents=True)
    (run / "finetune" / name / "finetune.json").write_text(json.dumps(finetune))
    data = read(run / "eval" / "results.json")
    spec = {"kind": "adapter", "model": f"/elsewhere/finetune/{name}", "options": {}}
    data["variants"].append({"label": name, "info": {"variant": spec}, "benchmarks": {
        "gsm8k": {"accuracy": gsm8k, "n": 100}, "mmlu": {"accuracy": 0.5, "n": 100}}})
    (run / "eval" / "results.json").write_text(json.dumps(data))


def test_random_heads_are_one_draw_or_a_band_over_seeds(tmp_path):
    run = make_run(tmp_path / "run", True)
    finetune = read(run / "finetune" / "precise-top2" / "finetune.json")
    finetune["components"]["source"] = "random 2 heads (seed 0)"

    def add(name: str, gsm8k: float) -> None:
        _add_tuned_row(run, name, finetune, gsm8k)

    def math_evidence() -> str:
        return next(f.evidence for f in findings(run) if f.claim.startswith("Precise SFT of the key heads"))

    add("random@2", 0.25)
    assert "random heads (random@2) (single random draw): +5.0" in math_evidence()
    add("random@2-seed1", 0.21)
    add("random@2-seed2", 0.30)
    assert "random heads (random@2): mean +5.3, range +1.0 to +10.0 over 3 seeds" in math_evidence()


def test_random_heads_are_weighed_against_precise_sft_of_as_many_heads(tmp_path):
    """Row 9 compares random@K with the precise run that tunes K chosen heads, never with a run of another size:
    with only random@3 beside the 2-head precise run, it is not measured; precise SFT of 3 heads makes it so."""
    run = make_run(tmp_path / "run", True)
    two = read(run / "finetune" / "precise-top2" / "finetune.json")

    def add(name: str, heads: list[dict], source: str, gsm8k: float) -> None:
        _add_tuned_row(run, name, {**two, "components": {**two["components"], "heads": heads, "source": source}}, gsm8k)

    three = [*two["components"]["heads"], {"layer": 0, "head": 3}]
    add("random@3", three, "random 3 heads (seed 0)", 0.25)
    row9 = findings(run)[8]
    assert row9.verdict == "not measured"
    assert row9.evidence == "no precise SFT run tunes as many heads and MLPs as random@3"
    add("precise@3", three, "top-3 heads of effects.json", 0.22)
    row9 = findings(run)[8]  # paired with precise@3 now, and tested item by item: without per-item files, not measured
    assert row9.verdict == "not measured" and "of precise@3 and every evaluated draw of random@3" in row9.evidence


def test_the_identify_section_says_how_the_key_heads_were_chosen(report, tmp_path):
    """Chosen by top-k (the tiny run's top 3), the rule is said so, not as 'threshold None'."""
    text = section_text(report.read_text(), "identify")
    assert "chosen as the top 3 by effect" in text and "None" not in text
    folder = make_run(tmp_path / "handmade", holds=True)  # chosen by the paper's -5% threshold
    page = render(folder)
    assert "chosen as effect below -0.05" in section_text(page, "identify")


def test_table1_says_its_knockout_row_is_not_the_papers(report):
    import html

    text = section_text(report.read_text(), "improve")
    assert "<td>knockout (aligned mean)</td>" in text  # the tiny run's table has a knockout row
    assert "A knockout row is keyheads' addition: the paper's table 1 has none" in html.unescape(text)


def test_the_faithfulness_curve_is_in_the_identify_section_when_written_there(run_folder, tmp_path):
    """`keyheads faithfulness --out RUN/identify` puts its figure into the run's report, after the heatmap."""
    from keyheads.faithfulness.curve import Curve
    from keyheads.faithfulness.plot import plot_curve

    copy = shutil.copytree(run_folder, tmp_path / "run")
    assert "MIB faithfulness" not in section_text(render(copy), "identify")
    curve = Curve.of(2.0, 0.0, [0.0, 0.0, 0.5, 1.0, 1.5, 1.8, 2.0, 2.0, 2.0, 2.0], [[]] * 10, level="node",
                     ablation="counterfactual", metric="logit", absolute=True, n_items=4, n_scored=15,
                     percentages=[0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0], sizes=[0] * 10)
    plot_curve(curve, copy / "identify" / "faithfulness.png")
    text = section_text(render(copy), "identify")
    assert "MIB faithfulness" in text
    assert text.index("heatmap") < text.index("faithfulness.png")

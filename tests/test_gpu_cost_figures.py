"""README's cost paragraph of the paper config (and bench/RESULTS.md's phase C section) is computed, not written:
bench/paper_gpu_records.py renders both from the committed records in records/paper-llama2-7b-gpu (the memory on 8 GPUs,
which no record measured, from the planner as `keyheads plan` calls it); a changed number in a record changes
the paragraph; and `report-records --check` finds a stale page."""
import json
import shutil
from pathlib import Path

import pytest

from bench import paper_gpu_records as gpu_records
from bench.results import read_section

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def figures(shared_data):
    return gpu_records.gather(gpu_records.record_folders(), shared_data)


def test_readme_and_results_carry_what_the_records_give(figures):
    assert gpu_records.written((ROOT / "README.md").read_text()) == gpu_records.readme_block(figures), \
        "README.md: run python -m bench.paper_gpu report-records"
    section = read_section(gpu_records.PHASE_C_TITLE, ROOT / "bench" / "RESULTS.md")
    assert section == gpu_records.results_body(figures).strip(), \
        "bench/RESULTS.md: run python -m bench.paper_gpu report-records"


def test_the_figures_are_the_records_fields(figures):
    """Each figure's source: finetune.json's speed, stages.jsonl's peak, the eval summaries' times."""
    from keyheads.results.finetune import FinetuneResult

    [full] = [t for t in figures.trained if t.variant == "full"]
    info = FinetuneResult.from_json(json.loads((gpu_records.RECORDS / full.record / "run" / "finetune" / "full" /
                                                "finetune.json").read_text()))
    assert full.samples_per_second == info.train.samples_per_second and full.parallel == "fsdp" == figures.parallel
    assert full.run_samples == info.data.n * info.config.epochs
    rows = [json.loads(x) for x in (gpu_records.RECORDS / full.record / "stages.jsonl").read_text().splitlines()]
    assert full.allocated_peak == next(r["allocated_peak"] for r in rows if r["stage"] == "finetune/full")
    assert full.first  # the only variant its run trained: its step holds the run's warm-up
    for e in figures.evals:  # the totals are the sums of RESULTS' rows, over the config's table
        assert e.rows == 2 + len(figures.variants)
        assert e.hours_at_cap == pytest.approx(sum(b.at_cap for b in e.benchmarks) / 3600)
    # the rows no record evaluated, and the variants no record trained, are named as unmeasured
    text = " ".join(gpu_records.readme_text(figures).split())
    assert f"The evaluation rows of {gpu_records.joined(figures.unevaluated)} are unmeasured" in text
    assert "precise@8" not in figures.unevaluated and "full" not in figures.untrained


def test_a_changed_number_in_a_record_changes_the_paragraph(shared_data, tmp_path):
    records = tmp_path / "records"
    shutil.copytree(gpu_records.RECORDS, records)
    unchanged = gpu_records.gather(gpu_records.record_folders(records), shared_data)
    before = gpu_records.readme_text(unchanged)
    # an eval time of the H200's record: its GPU-hours change, the H100's do not
    summary = records / "2026-11-27-c1-d" / "run" / "eval" / "tmp_paper-gpu-model_base" / "mmlu.json"
    data = json.loads(summary.read_text())
    data["timing"]["seconds"] *= 4
    summary.write_text(json.dumps(data))
    # full SFT's speed and its peak memory
    info = records / "2026-11-27-c1-d" / "run" / "finetune" / "full" / "finetune.json"
    data = json.loads(info.read_text())
    data["train"]["samples_per_second"] = 2.0
    info.write_text(json.dumps(data))
    stages = records / "2026-11-27-c1-d" / "stages.jsonl"
    rows = [json.loads(x) for x in stages.read_text().splitlines()]
    for r in rows:
        if r["stage"] == "finetune/full":
            r["allocated_peak"] = 100 * 2**30
    stages.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fig = gpu_records.gather(gpu_records.record_folders(records), shared_data)
    after = gpu_records.readme_text(fig)
    assert after != before
    flat = " ".join(after.split())
    assert "full SFT allocated 100.0 GiB" in flat and "full SFT 2.0 samples/s (first)" in flat
    assert f"{16012 / 2.0 / 60:.0f} minutes for full SFT" in flat
    [h200, h100], [h200_before, h100_before] = fig.evals, unchanged.evals
    assert h200.hours_at_cap > h200_before.hours_at_cap and f"on the H200, {h200.hours_at_cap:.1f} GPU-hours" in flat
    assert h100 == h100_before


def test_a_stale_readme_is_found_and_rewritten(shared_data, tmp_path, monkeypatch):
    readme, results = tmp_path / "README.md", tmp_path / "RESULTS.md"
    shutil.copy(ROOT / "README.md", readme)
    shutil.copy(ROOT / "bench" / "RESULTS.md", results)
    monkeypatch.setattr(gpu_records, "README", readme)
    monkeypatch.setattr(gpu_records, "RESULTS_MD", results)
    check = ["--check", "--data-dir", str(shared_data)]
    assert gpu_records.main(check) == 0
    block = gpu_records.written(readme.read_text())
    readme.write_text(readme.read_text().replace(block, block.replace("GPU-hours", "GPU-hours (retyped: 6.5)", 1)))
    assert gpu_records.main(check) == 1
    assert gpu_records.main(check[1:]) == 0 and gpu_records.main(check) == 0
    assert readme.read_text() == (ROOT / "README.md").read_text()
    readme.write_text(readme.read_text().replace(gpu_records.README_BEGIN, ""))  # no markers: an error, not a pass
    assert gpu_records.main(check) == 1


def test_the_data_folder_is_keyheads_data_when_set(monkeypatch, tmp_path):
    monkeypatch.setenv("KEYHEADS_DATA", str(tmp_path))
    assert gpu_records.default_data_dir() == tmp_path
    monkeypatch.delenv("KEYHEADS_DATA")
    assert gpu_records.default_data_dir() == ROOT.parent / "shared" / "data" / "benchmarks"

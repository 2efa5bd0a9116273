"""Every run folder committed under records/ reads through the run folder's typed readers (keyheads.results), the
ones the report reads it with: a record that no longer parses as its type fails here, and when it is read, with
the file and the field named, never as a report section that says its stage did not run."""
import json
import re
import shutil
from pathlib import Path

import pytest

from keyheads.errors import BadFile
from keyheads.report.html import render
from keyheads.results.evaluation import EvalResults
from keyheads.results.finetune import FinetuneResult
from keyheads.runfolder import RunFolder

RECORDS = Path(__file__).resolve().parents[1] / "records"
RUNS = sorted(stages.parent for stages in RECORDS.glob("**/stages") if stages.is_dir() and "cells" not in stages.parts)
CELLS = sorted({record.parent.parent for record in RECORDS.glob("*/cells/*/record.json")})


def test_the_records_have_run_folders():
    assert len(RUNS) >= 2, RUNS


@pytest.mark.parametrize("cells", CELLS, ids=[str(c.relative_to(RECORDS)) for c in CELLS])
def test_a_study_kept_as_cells_reads_as_one_run(cells, tmp_path):
    """Each cell's stage records read as their type; the cells merged read as a run, with a config, a model and
    every cell's stages, and render."""
    from keyheads.study.cells import ROW_FOLDER, merge

    for folder in sorted(cells.glob("*/run")):
        assert RunFolder(folder).stage_records, folder
    merged = merge(cells, tmp_path / "merged")
    read = merged.read_all()
    assert read["config_record"] and read["model_record"] and read["effects_record"] is not None
    assert set(merged.stage_records) == {name for folder in cells.glob("*/run") for name in RunFolder(folder)
                                         .stage_records}
    # every evaluated cell is a row of the merged table, listed in the recorded config or not
    rows = {json.loads(f.read_text())["cell"].split("/", 1)[1] for f in cells.glob("*/record.json")
            if (f.parent / "run" / ROW_FOLDER).is_dir()}
    labels = [v.label for v in merged.eval_record.variants] if rows else []
    assert len(labels) == len(rows), (sorted(rows), labels)
    assert "Findings" in render(merged.root)


@pytest.mark.parametrize("run", RUNS, ids=[str(r.relative_to(RECORDS)) for r in RUNS])
def test_every_committed_run_folder_reads_as_its_types(run):
    folder = RunFolder(run)
    read = folder.read_all()
    assert read["config_record"] and read["model_record"] and read["stage_records"]
    # each artifact a stage says it wrote is read, as its type
    written = {rel for record in folder.stage_records.values() for rel in record.outputs}
    assert (read["effects_record"] is not None) == (RunFolder.EFFECTS in written)
    assert (read["key_heads_record"] is not None) == (RunFolder.KEY_HEADS in written)
    assert (read["eval_record"] is not None) == (RunFolder.EVAL_RESULTS in written)
    assert set(read["finetune_records"]) == {rel.split("/")[1] for rel in written
                                              if rel.startswith("finetune/") and rel.endswith("/finetune.json")}
    assert set(read["also_identify_records"]) == {rel.split("/")[1] for rel in written
                                                   if re.fullmatch(r"identify/[^/]+/key_heads\.json", rel)}
    for info in read["finetune_records"].values():
        assert isinstance(info, FinetuneResult) and info.train.losses
    if read["eval_record"] is not None:
        assert isinstance(read["eval_record"], EvalResults) and read["eval_record"].variants
    assert "Findings" in render(run)


def _damage(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


DAMAGE = {  # file -> (how it is damaged, what the error names)
    "finetune/full/finetune.json": (lambda d: d.update(tuned_params="many"), "tuned_params"),
    "eval/results.json": (lambda d: d["variants"][0]["benchmarks"]["gsm8k"].update(accuracy="high"),
                          "variants.0.benchmarks.gsm8k.accuracy"),
    "identify/key_heads.json": (lambda d: d["heads"][0].pop("layer"), "heads.0.layer"),
    "identify/gsm8k/effects.json": (lambda d: d.update(n_samples=[1]), "n_samples"),
    "model.json": (lambda d: d.pop("fingerprint"), "fingerprint"),
    "stages/data.json": (lambda d: d.update(seconds="slow"), "seconds"),
}


@pytest.mark.parametrize("rel", list(DAMAGE))
def test_a_damaged_record_fails_naming_the_file_and_the_field(tmp_path, rel):
    run = shutil.copytree(next(r for r in RUNS if (r / "finetune" / "full").is_dir()), tmp_path / "run")
    RunFolder(run).read_all()  # the copy reads, before the damage
    change, field = DAMAGE[rel]
    _damage(run / rel, change)
    with pytest.raises(BadFile, match=re.escape(str(run / rel)) + ".*" + re.escape(field)):
        RunFolder(run).read_all()
    with pytest.raises(BadFile, match=re.escape(str(run / rel))):
        render(run)


def test_a_cut_file_fails_and_a_missing_one_is_none(tmp_path):
    run = shutil.copytree(RUNS[0], tmp_path / "run")
    path = run / RunFolder.KEY_HEADS
    path.write_text(path.read_text()[:100])
    with pytest.raises(BadFile, match=re.escape(str(path)) + ".*not valid JSON"):
        RunFolder(run).read_all()
    path.unlink()
    assert RunFolder(run).key_heads_record is None


def test_no_record_holds_the_benchmarks_text():
    """Records keep each evaluated item's id and answer; the questions, choices and gold answers stay in the
    benchmark folder they came from (studies/record.py cuts them)."""
    for path in RECORDS.glob("**/*.wrong.jsonl"):
        for line in path.read_text().splitlines():
            assert not {"question", "choices", "gold"} & set(json.loads(line)), path


def test_no_record_holds_benchmark_prompts():
    """Neither the pairs made from GSM8K questions nor the transfer sets' example prompts are committed."""
    assert not list(RECORDS.glob("**/identify/gsm8k/pairs.jsonl")) and not list(RECORDS.glob("**/transfer_cases.txt"))
    for path in RECORDS.glob("**/knockout/knockout.json"):
        assert json.loads(path.read_text()).get("transfer", {}).get("cases") in ([], None), path


CONFIGS = sorted(p for p in RECORDS.glob("**/config.json") if p.parent.joinpath("stages").is_dir())


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(RECORDS)) for p in CONFIGS])
def test_a_saved_config_reads_typed_and_writes_back_as_it_was(path):
    """config.json as SavedConfig: the keys the report reads come typed, and to_json() is the file's content in the
    file's order (the report's configuration table lists it so)."""
    from keyheads.results.run import SavedConfig

    data = json.loads(path.read_text())
    saved = SavedConfig.from_json(data)
    assert json.dumps(saved.to_json()) == json.dumps(data)
    assert saved.model == data.get("model") and saved.also_identify == data.get("also_identify")
    section = data.get("data")
    assert (saved.data is None) if section is None else (saved.data.task == section.get("task", "addition"))


@pytest.mark.parametrize("broken", ['{"cell": "eval/base"}', '{"cell": "eval/ba'], ids=["missing-keys", "truncated"])
def test_merging_cells_with_a_broken_record_names_the_file(broken, tmp_path):
    """A damaged cell record stops the merge with a BadFile that names it, not a validation traceback."""
    from keyheads.study.cells import merge

    # two levels down: `keyheads study status` estimates from every */cells/*/record.json beside a records folder,
    # and other tests keep theirs in this session's temporary folders
    cells = tmp_path / "records" / "broken" / "cells"
    shutil.copytree(CELLS[0] / "identify", cells / "identify")
    (cells / "eval--base").mkdir()
    (cells / "eval--base" / "record.json").write_text(broken)
    with pytest.raises(BadFile, match=r"eval--base/record\.json"):
        merge(cells, tmp_path / "merged")

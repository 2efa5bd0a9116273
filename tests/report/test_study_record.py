"""studies/record.py keeps a run folder's small outputs as a record the typed readers take, and nothing heavy."""
import json
from pathlib import Path

import pytest

from keyheads.report.findings import findings
from keyheads.study.records import ITEM_KEYS
from studies import pages
from studies import record as record_script

ROOT = Path(__file__).resolve().parents[2]


def test_a_record_keeps_the_small_outputs_and_reads_as_the_run(run_folder, tmp_path):
    dest = tmp_path / "records" / "tiny" / "t1"
    assert record_script.main([str(run_folder), str(dest), "--commit", "abc", "--command", "keyheads run x"]) == 0
    kept = {p.relative_to(dest / "run").as_posix() for p in (dest / "run").rglob("*") if p.is_file()}
    every = {p.relative_to(run_folder).as_posix() for p in run_folder.rglob("*") if p.is_file()}
    heavy = {p for p in every if p.endswith((".safetensors", ".npz", ".png", ".html", ".sqlite", ".pt", ".bin"))}
    assert heavy and not heavy & kept  # the tiny run has weights, figures and arrays: none is kept
    assert kept <= every and "config.json" in kept and "identify/key_heads.json" in kept
    assert any(p.startswith("stages/") for p in kept)
    assert any(p.startswith("finetune/") and p.endswith("/finetune.json") for p in kept)
    assert any(p.endswith(".wrong.jsonl") for p in kept) and "eval/results.json" in kept
    assert json.loads((dest / "record.json").read_text())["commit"] == "abc"
    for path in (dest / "run").rglob("*.wrong.jsonl"):  # the items' ids and answers, none of the benchmark's text
        source = [json.loads(line) for line in (run_folder / path.relative_to(dest / "run")).read_text().splitlines()]
        kept = [json.loads(line) for line in path.read_text().splitlines()]
        assert [r["id"] for r in kept] == [r["id"] for r in source]
        assert all(set(r) <= set(ITEM_KEYS) for r in kept)
    # the findings computed from the record are the run's own
    assert [f.to_json() for f in findings(dest / "run")] == [f.to_json() for f in findings(run_folder)]


def test_a_record_is_written_once_and_a_damaged_run_is_refused(run_folder, tmp_path):
    import shutil

    dest = tmp_path / "t1"
    record_script.main([str(run_folder), str(dest), "--commit", "a", "--command", "c"])
    with pytest.raises(SystemExit, match="exists"):
        record_script.main([str(run_folder), str(dest), "--commit", "a", "--command", "c"])
    copy = Path(shutil.copytree(run_folder, tmp_path / "damaged"))
    path = copy / "knockout" / "knockout.json"
    data = json.loads(path.read_text())
    del data["key_heads"]
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="knockout.json"):
        record_script.main([str(copy), str(tmp_path / "t2"), "--commit", "a", "--command", "c"])
    assert not (tmp_path / "t2").exists() and not (tmp_path / "t2.partial").exists()


def test_a_run_still_going_is_recorded_up_to_its_finished_stages(run_folder, tmp_path):
    """A stage started and not finished (its .started marker, no record) leaves its folder out, partial files and
    all; record.json lists the finished stages."""
    import shutil

    live = Path(shutil.copytree(run_folder, tmp_path / "live"))
    (live / "stages" / "knockout.json").rename(live / "stages" / "knockout.started")
    (live / "knockout" / "knockout_curves.partial.json").write_text("{}")
    dest = tmp_path / "t1"
    assert record_script.main([str(live), str(dest), "--commit", "a", "--command", "c"]) == 0
    kept = {p.relative_to(dest / "run").as_posix() for p in (dest / "run").rglob("*") if p.is_file()}
    assert not any(p.startswith("knockout/") for p in kept) and "identify/key_heads.json" in kept
    stages = json.loads((dest / "record.json").read_text())["stages"]
    assert "knockout" not in stages and {"data", "identify"} <= set(stages)
    verdicts = {f.row: f.verdict for f in findings(dest / "run")}
    assert verdicts[3] == "not measured" and verdicts[1] == {f.row: f.verdict for f in findings(run_folder)}[1]


def test_a_record_names_each_stage_s_commit_when_it_differs(run_folder, tmp_path):
    """Stage records name the commit that ran them: without --commit the record takes the one they share; a stage
    under another commit is listed in stage_commits (and on the page); stages that name none need --commit."""
    import shutil

    run = Path(shutil.copytree(run_folder, tmp_path / "run"))
    records = sorted((run / "stages").glob("*.json"))

    def name(commits):
        for path in records:
            data = json.loads(path.read_text())
            data["versions"]["commit"] = commits(path.stem)
            if data["versions"]["commit"] is None:
                del data["versions"]["commit"]
            path.write_text(json.dumps(data))

    name(lambda stage: "a" * 40)
    assert record_script.main([str(run), str(tmp_path / "r1"), "--command", "c"]) == 0
    meta = json.loads((tmp_path / "r1" / "record.json").read_text())
    assert meta["commit"] == "a" * 40 and "stage_commits" not in meta
    name(lambda stage: "b" * 40 if stage == "knockout" else "a" * 40)
    with pytest.raises(SystemExit, match="give --commit: the stages name 2 commits"):
        record_script.main([str(run), str(tmp_path / "r2"), "--command", "c"])
    assert record_script.main([str(run), str(tmp_path / "r2"), "--command", "c", "--commit", "a" * 40]) == 0
    meta = json.loads((tmp_path / "r2" / "record.json").read_text())
    assert meta["commit"] == "a" * 40 and meta["stage_commits"] == {"knockout": "b" * 40}
    assert f"- stage knockout ran on commit {'b' * 40}" in pages.provenance(tmp_path / "r2", "r2")
    name(lambda stage: None if stage == "data" else "a" * 40)
    with pytest.raises(SystemExit, match="give --commit: stage\\(s\\) data name no commit"):
        record_script.main([str(run), str(tmp_path / "r3"), "--command", "c"])

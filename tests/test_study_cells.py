"""A study as cells (keyheads.study): each cell commits its own record; status reads the records; cells run on any
machine, here or as submitit jobs; a killed cell runs again; the merged records give the findings of one run."""
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from keyheads.cli import main
from keyheads.config.run import RunSettings
from keyheads.errors import BadFile
from keyheads.report.findings import findings
from keyheads.study.cells import cells_of, merge, run_cell, status
from keyheads.testing import tiny_model

from tests.helpers import write_tiny_benchmarks

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # whole cells on a tiny model, and job processes


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """A tiny model on disk, its training and benchmark files, and a config of every kind of cell."""
    root = tmp_path_factory.mktemp("study")
    model = tiny_model("llama", seed=0)
    model.hf.save_pretrained(root / "model")
    model.tokenizer.save_pretrained(root / "model")
    (root / "train.jsonl").write_text("".join(json.dumps({"prompt": f"{a} + 1 = ", "completion": str(a + 1)}) + "\n"
                                              for a in range(8)))
    (root / "benchmarks").mkdir()
    write_tiny_benchmarks(root / "benchmarks")
    config = {"model": str(root / "model"), "out": str(root / "run"), "batch_size": 4,
              "data_dir": str(root / "benchmarks"), "data": {"keep_correct": False, "n": 16, "task": "addition"},
              "identify": {"top_k": 3}, "knockout": {"k": 3, "seeds": 2, "limit": None, "transfer_n": 4},
              "attention": {"limit": None}, "mlp": {"limit": None}, "variants": ["precise"],
              "finetune": {"train": str(root / "train.jsonl"), "max_steps": 2, "optimizer_batch_size": 4,
                           "micro_batch_size": 2},
              "eval": {"benchmarks": ["mmlu", "arith-add", "generic-kl"], "limit": 4, "few_shot": 1}}
    (root / "study.yaml").write_text(json.dumps(config))  # JSON is YAML
    return root


def without_timing(value):
    """A JSON value less its `timing` entries (seconds, and items computed or found in a cache)."""
    if isinstance(value, dict):
        return {k: without_timing(v) for k, v in value.items() if k != "timing"}
    if isinstance(value, list):
        return [without_timing(v) for v in value]
    return value


def cfg_of(study: Path, **over) -> RunSettings:
    return RunSettings.from_yaml(study / "study.yaml", **over)


def states(cfg: RunSettings, records: Path) -> dict[str, str]:
    return {s.cell.name: s.state for s in status(cfg, records)}


def test_every_cell_is_listed_and_one_committed_elsewhere_is_done_here(study, tmp_path, capsys):
    cfg = cfg_of(study)
    assert [c.name for c in cells_of(cfg)] == ["identify", "knockout", "attention", "mlp", "eval/base",
                                               "eval/knockout", "finetune/precise"]
    records = tmp_path / "records"
    run_cell(cfg, records, "identify", progress=False)
    run_cell(cfg, records, "knockout", progress=False)
    assert states(cfg, records) == {"identify": "done", "knockout": "done", "attention": "pending", "mlp": "pending",
                                    "eval/base": "pending", "eval/knockout": "pending", "finetune/precise": "pending"}
    # another machine: the records only, under another checkout and another work folder
    clone = tmp_path / "clone"
    shutil.copytree(records, clone / "records")
    elsewhere = cfg_of(study, out=str(tmp_path / "elsewhere"))
    assert states(elsewhere, clone / "records")["knockout"] == "done"
    assert main(["study", "status", str(study / "study.yaml"), "--records", str(clone / "records"),
                 "--out", str(tmp_path / "elsewhere")]) == 0
    shown = capsys.readouterr().out
    assert "knockout" in shown and "2 done, 0 stale, 5 pending" in shown
    # a changed setting makes its cell stale and says which; identify done again with other key heads makes the
    # knockout, which read the old ones, stale too
    more = cfg_of(study, knockout={"k": 4})
    [knock] = [s for s in status(more, records) if s.cell.name == "knockout"]
    assert knock.state == "stale" and "k 3 -> 4" in knock.why
    fewer = cfg_of(study, identify={"top_k": 2})
    run_cell(fewer, records, "identify", progress=False)
    [knock] = [s for s in status(fewer, records) if s.cell.name == "knockout"]
    assert knock.state == "stale" and "input identify/key_heads.json changed" in knock.why


def test_a_cell_needs_its_upstream_cell_and_a_tampered_record_is_refused(study, tmp_path):
    cfg = cfg_of(study)
    records = tmp_path / "records"
    with pytest.raises(Exception, match="run it first"):
        run_cell(cfg, records, "knockout", progress=False)
    run_cell(cfg, records, "identify", progress=False)
    effects = records / "identify" / "run" / "identify" / "effects.json"
    effects.write_text(effects.read_text().replace("relative-logit", "relative_logit"))
    with pytest.raises(BadFile, match="not the ones its stage record names"):
        run_cell(cfg_of(study, out=str(tmp_path / "w")), records, "mlp", progress=False)


def _wait_for_task(job, timeout: float = 300.0) -> None:
    """Until the job's task process has started (submitit opened its log), seconds before it can finish: it still
    imports torch, restores its inputs and runs its stage. Waiting for the stage itself raced on a loaded machine: a
    tiny study's stage ends in a fraction of a second, and the job finished before the signal reached it."""
    stop = time.monotonic() + timeout
    while not job.paths.stderr.exists() and time.monotonic() < stop:
        assert job.state not in ("FINISHED", "FAILED", "INTERRUPTED"), f"the job ended unstarted: {job.state}"
        time.sleep(0.05)


def _kill(job) -> None:
    """SIGKILL the job's task and its controller, as a node that goes away kills them. Not submitit's cancel: that
    is a SIGINT, which a shell's background job (a CI runner's, a nohup) ignores, and the processes it starts too."""
    pid = int(job.job_id)  # the local controller's process; its children are the tasks
    children = Path(f"/proc/{pid}/task/{pid}/children")
    stop = time.monotonic() + 60
    while not children.read_text().split() and time.monotonic() < stop:
        time.sleep(0.05)
    for task in children.read_text().split():
        os.kill(int(task), signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)


def test_cells_as_submitit_jobs_a_killed_one_rerun_merge_to_one_run_s_findings(study, tmp_path):
    pytest.importorskip("submitit")
    from submitit.core.utils import FailedJobError, UncompletedJobError

    from keyheads.study.jobs import submit

    cfg = cfg_of(study, out=str(tmp_path / "work"))
    over = {"out": str(tmp_path / "work")}
    records = tmp_path / "records"
    run_cell(cfg, records, "identify", progress=False)
    jobs = submit(str(study / "study.yaml"), over, records, ["knockout", "eval/base"], "local", tmp_path / "jobs")
    _wait_for_task(jobs[1])
    _kill(jobs[1])  # killed, as a preempted job is
    assert jobs[0].result().endswith("knockout")
    try:
        returned = jobs[1].result()
    except (UncompletedJobError, FailedJobError):  # submitit's own errors for a killed job
        returned = None
    assert returned is None, f"the killed job finished ({jobs[1].state}): {(jobs[1].stderr() or '')[-3000:]}"
    assert states(cfg, records)["eval/base"] == "pending"  # a killed cell leaves no record
    [again] = submit(str(study / "study.yaml"), over, records, ["eval/base"], "local", tmp_path / "jobs")
    assert again.result().endswith("eval--base")
    for name in ("attention", "mlp", "eval/knockout", "finetune/precise"):
        run_cell(cfg, records, name, progress=False)
    merged = merge(records, tmp_path / "merged", cfg)
    assert main(["run", str(study / "study.yaml"), "--out", str(tmp_path / "whole"), "--quiet"]) == 0
    whole = [f.to_json() for f in findings(tmp_path / "whole")]
    assert [f.to_json() for f in findings(merged)] == whole
    assert json.loads((merged.root / "eval" / "results.json").read_text())["variants"][0]["label"].endswith("(base)")
    # every row's every figure, generic KL included: a row's cell evaluates that row alone, its drift measured against
    # the base model, and gets what the whole table (its base row evaluated first) gets
    rows = [without_timing(json.loads((root / "eval" / "results.json").read_text())["variants"])
            for root in (merged.root, tmp_path / "whole")]
    # the rows after the base row: their cells ran in this process, as the whole run did (`info` names each one's own
    # folder); the base row's cell ran as a job, a process of its own thread count, so its perplexity may differ in
    # the last bits: its counts must not
    assert [(r["label"], r["fingerprint"], r["benchmarks"]) for r in rows[0][1:]] == \
        [(r["label"], r["fingerprint"], r["benchmarks"]) for r in rows[1][1:]]
    assert [{b: s.get("correct") for b, s in r["benchmarks"].items()} for r in (rows[0][0], rows[1][0])] == \
        [{b: s.get("correct") for b, s in rows[1][0]["benchmarks"].items()}] * 2
    assert rows[0][2]["benchmarks"]["generic-kl"]["kl"] > 0 and rows[0][2]["benchmarks"]["generic-kl"]["reference"] \
        .endswith("(base)")
    for cell, label in (("eval--knockout", rows[0][1]["label"]), ("finetune--precise", rows[0][2]["label"])):
        table = next((records / cell / "run" / "eval-rows").glob("*/results.json"))
        assert [v["label"] for v in json.loads(table.read_text())["variants"]] == [label]  # the base row is not in
    # a study kept as cells is a column of the findings table and has its page, as a whole run's record has
    from studies import findings as table
    from studies import pages
    assert table.column(str(records), root=Path("/")) == {str(f.row): table.cell(f) for f in findings(merged)}
    page = pages.page({"title": "Tiny", "record": str(records)}, root=Path("/"))
    assert "| finetune/precise | `" in page and "## Tables 1 and 2" in page


def test_slurm_parameters_are_submitit_s():
    from keyheads.commands.study import _parse_slurm

    assert _parse_slurm("partition=gpu,gpus_per_node=1,timeout_min=240") == {
        "slurm_partition": "gpu", "gpus_per_node": 1, "timeout_min": 240}
    with pytest.raises(Exception, match="KEY=VALUE"):
        _parse_slurm("partition")


def test_each_family_trains_at_its_grid_s_rate_of_lowest_validation_loss(study, tmp_path):
    """finetune.lr_grid: each rate a cell, scored on validation examples; a variant trains at its family's choice,
    random heads at precise's; the choice is a page's table and the variant's stage input."""
    from keyheads.pipeline import rate_family

    assert [rate_family(v) for v in ("random@32-seed1", "random", "precise@16+mlp3", "full")] == [
        "precise@32", "precise", "precise@16+mlp3", "full"]
    cfg = cfg_of(study, out=str(tmp_path / "work"), variants=["precise", "random", "full"],
                 finetune={"lr_grid": {"precise": [1e-4, 3e-2], "full": [1e-5, 1e-3]}, "validation": 3,
                           "max_steps": 6, "warmup_ratio": 0.0})
    records = tmp_path / "records"
    names = [c.name for c in cells_of(cfg)]
    assert [n for n in names if n.startswith("finetune/")] == [
        "finetune/grid/precise/0.0001", "finetune/grid/precise/0.03", "finetune/grid/full/1e-05",
        "finetune/grid/full/0.001", "finetune/precise", "finetune/random", "finetune/full"]
    for name in ["identify", *names[names.index("finetune/grid/precise/0.0001"):]]:
        if name != "finetune/full":
            run_cell(cfg, records, name, progress=False)
    merged = merge(records, tmp_path / "merged", cfg)
    losses = {(p.parent.parent.name, float(p.parent.name)): json.loads(p.read_text())["validation_loss"]
              for p in merged.root.glob("grid/*/*/grid.json")}
    assert len(losses) == 4 and len(set(losses.values())) == 4  # each rate changed the model its own way
    best = min((1e-4, 3e-2), key=lambda lr: losses[("precise", lr)])
    for variant in ("precise", "random"):
        info = json.loads((merged.root / "finetune" / variant / "finetune.json").read_text())
        assert info["config"]["lr"] == best, variant
    from studies import pages

    page = pages.page({"title": "Grid", "record": str(records)}, root=Path("/"))
    assert "## Learning rates" in page and f"| precise | {best:g} |" in page
    # the fraction of the schedule is a grid point's setting; the validation size every variant's
    fraction = cfg_of(study, out=str(tmp_path / "work"), variants=["precise", "random", "full"],
                      finetune={"lr_grid": {"precise": [1e-4, 3e-2], "full": [1e-5, 1e-3]}, "validation": 3,
                                "max_steps": 6, "warmup_ratio": 0.0, "grid_fraction": 0.5})
    stale = {s.cell.name for s in status(fraction, records) if s.state == "stale"}
    assert {"finetune/grid/precise/0.0001", "finetune/grid/full/1e-05"} <= stale and "finetune/precise" not in stale


def test_a_cell_made_by_other_code_is_stale_and_says_which_module(study, tmp_path, monkeypatch):
    """The record keeps a hash of each module its stages compute with; a changed statement in one makes the cell
    stale, while a changed docstring or comment does not (the hash is of the syntax tree without docstrings); a cell
    run again does not take the outputs other code left in its work folder."""
    from keyheads.study import code

    cfg = cfg_of(study)
    records = tmp_path / "records"
    run_cell(cfg, records, "identify", progress=False)
    run_cell(cfg, records, "knockout", progress=False)
    signed = json.loads((records / "knockout" / "record.json").read_text())["code"]
    assert "knockout.py" in signed and "analysis/knockout_curves.py" in signed and "finetune/train.py" not in signed
    assert states(cfg, records)["knockout"] == "done"
    # a copy of the package where knockout.py differs in a docstring and a comment only, then in a statement
    copy = tmp_path / "pkg"
    shutil.copytree(code.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    source = (copy / "knockout.py").read_text()
    monkeypatch.setattr(code, "PACKAGE", copy)
    code._files.cache_clear()
    (copy / "knockout.py").write_text(source.replace('"""Mean ablation', '"""Mean-value ablation', 1) + "\n# a note\n")
    assert states(cfg, records)["knockout"] == "done"
    (copy / "knockout.py").write_text(source + "\nEXTRA = 1\n")
    [knock] = [s for s in status(cfg, records) if s.cell.name == "knockout"]
    assert knock.state == "stale" and knock.why == "code changed: knockout.py"
    assert states(cfg, records)["identify"] == "done"  # identify computes with other code
    # run again, the work folder's outputs were made by the other code: they are not reused as this code's record
    said: list[str] = []
    run_cell(cfg, records, "knockout", progress=False, say=said.append)
    assert any("made by other code" in s for s in said) and states(cfg, records)["knockout"] == "done"
    again: list[str] = []
    run_cell(cfg, records, "knockout", progress=False, say=again.append)  # same code: its work folder is kept
    assert not any("made by other code" in s for s in again)
    code._files.cache_clear()


def test_rates_chosen_elsewhere_train_their_family_without_a_grid(study):
    """finetune.lr_chosen: a variant of a listed family (or method) trains at that rate, which its stage settings
    hold; a family both chosen and gridded is refused."""
    from keyheads.errors import SettingError
    from keyheads.pipeline import variant_lr
    from keyheads.runfolder import RunFolder
    from keyheads.study.cells import plan

    cfg = cfg_of(study, finetune={"lr_chosen": {"precise": 1.0e-3}})
    stages = {s.name: s for s in plan(cfg, Path(cfg.out))}
    assert stages["finetune/precise"].settings["lr"] == 1.0e-3
    assert not any(name.startswith("finetune/grid/") for name in stages)
    assert variant_lr(cfg, RunFolder(Path(cfg.out)), "precise") == 1.0e-3
    assert variant_lr(cfg_of(study), RunFolder(Path(cfg.out)), "precise") == cfg.finetune.lr
    with pytest.raises(SettingError, match="not both"):
        cfg_of(study, finetune={"lr_chosen": {"precise": 1.0e-3}, "lr_grid": {"precise": [1.0e-4, 1.0e-3]}})


def test_a_whole_run_record_s_identify_and_analyses_are_adopted_as_done_cells(study, tmp_path):
    """tools/adopt_run_record.py: a run made whole (not as cells) and recorded as studies/record.py keeps it gives its
    identify and knockout stages as cells that status calls done, with the run's files as its record keeps them."""
    from keyheads.io import write_json
    from keyheads.pipeline import run_pipeline
    from keyheads.study.records import copy_kept, small_outputs

    from tests.helpers import load_script

    cfg = cfg_of(study, out=str(tmp_path / "whole"))
    run_pipeline(cfg, stages=["data", "identify", "knockout"], progress=False)
    record = tmp_path / "rec"
    copy_kept(Path(cfg.out), small_outputs(Path(cfg.out)), record / "run")
    write_json(record / "record.json", {"commit": "0" * 40, "command": "keyheads run study.yaml"})
    adopt = load_script(Path(__file__).resolve().parents[1] / "tools" / "adopt_run_record.py", "adopt_run_record")
    records = tmp_path / "cells"
    assert adopt.main([str(study / "study.yaml"), str(record), "--records", str(records)]) == 0
    got = states(cfg, records)
    assert got["identify"] == "done" and got["knockout"] == "done" and got["mlp"] == "pending"
    made = json.loads((records / "knockout" / "record.json").read_text())
    assert made["adopted_from"] == str(record) and made["commit"] == "0" * 40 and "code" not in made
    for rel in ("identify/key_heads.json", "identify/effects.json"):  # knockout.json: its cases cut, as kept
        assert (records / rel.split("/")[0] / "run" / rel).read_bytes() == (Path(cfg.out) / rel).read_bytes()
    # the adopted identify feeds a cell run here
    run_cell(cfg_of(study, out=str(tmp_path / "w")), records, "mlp", progress=False)
    assert states(cfg, records)["mlp"] == "done"


def test_a_new_study_s_cells_are_estimated_from_other_studies_scaled_by_model_size(study, tmp_path, monkeypatch):
    """A pending cell with no measured cell of its kind in its study takes the median of the other studies' cells of
    its kind, each scaled by the ratio of the models' parameter counts."""
    from keyheads.io import write_json
    from keyheads.study import cells

    sizes = {"small": 100, "twice": 200, "half": 50}
    monkeypatch.setattr(cells, "_params", lambda model: sizes.get(Path(model).name))
    root = tmp_path / "records"
    for name, model, seconds in (("a", "small", 60.0), ("b", "twice", 60.0), ("c", "half", 600.0)):
        write_json(root / name / "cells" / "identify" / "record.json",
                   {"cell": "identify", "model": model, "command": "keyheads study run", "commit": None,
                    "stages": ["data", "identify"], "wall_seconds": seconds})
    cfg = cfg_of(study, model="small")
    [identify] = [s for s in status(cfg, root / "new" / "cells") if s.cell.name == "identify"]
    assert identify.state == "pending"
    assert identify.seconds == pytest.approx(60.0)  # the median of 60 * 100/100, 60 * 100/200 and 600 * 100/50
    [knock] = [s for s in status(cfg, root / "new" / "cells") if s.cell.name == "knockout"]
    assert knock.seconds is None  # no study has measured a knockout cell


def test_an_error_message_s_words_keep_a_signature_and_a_statement_does_not():
    """Hashing blanks what a raised error says (its words compute nothing), not the condition that raises it."""
    from keyheads.study.code import source_hash

    base = ('def f(x):\n    if x < 0:\n        raise ValueError(f"{x} is negative: run `keyheads old-name`")\n'
            '    return x\n')
    assert source_hash(base) == source_hash(base.replace("keyheads old-name", "keyheads new-name"))
    assert source_hash(base) != source_hash(base.replace("x < 0", "x <= 0"))
    assert source_hash(base) != source_hash(base.replace("ValueError", "KeyError"))


def test_the_witness_need_not_reach_a_raise_but_must_reach_the_condition_before_it():
    """A witness run that reached a `raise`, or an `except` clause that only raises, would end in it, so a changed
    one is exempt from being reached; every line of a raise spanning several is, and no other statement."""
    from keyheads.study.witness import raising_lines

    text = ('def f(x):\n    if x.get("a") < 0:\n        raise ValueError(\n            f"{x} is negative")\n'
            '    try:\n        y = int(x["a"])\n    except ValueError as err:\n        raise KeyError(err) from None\n'
            '    except KeyError:\n        y = 0\n    return y\n')
    assert raising_lines(text) == {3, 4, 7, 8}


def test_resigning_takes_a_record_s_own_commit_sources_and_checks_them(tmp_path, monkeypatch):
    """tools/resign_cells.py: a record signed with the older hashing gets today's hashes of its commit's sources;
    a record whose signature is not of those sources is left as it was and named."""
    from keyheads.study.code import source_hash

    from tests.helpers import load_script

    tool = load_script(Path(__file__).resolve().parents[1] / "tools" / "resign_cells.py", "resign_cells")
    text = 'def f(x):\n    raise ValueError("old words")\n'
    monkeypatch.setattr(tool, "sources_at", lambda commit, stages: {"knockout.py": text})
    old = {"knockout.py": tool.hash_before_messages_were_blanked(text)}
    assert old["knockout.py"] != source_hash(text)
    for name, signed in (("good", old), ("bad", {"knockout.py": "0" * 16})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "record.json").write_text(json.dumps({"commit": "c" * 40, "stages": ["knockout"],
                                                                 "code": signed}))
    assert tool.resign(tmp_path / "good") == "re-signed"
    assert json.loads((tmp_path / "good" / "record.json").read_text())["code"] == {"knockout.py": source_hash(text)}
    assert tool.resign(tmp_path / "good") == "already signed with today's hashing"
    assert tool.resign(tmp_path / "bad").startswith("LEFT")
    assert json.loads((tmp_path / "bad" / "record.json").read_text())["code"] == {"knockout.py": "0" * 16}


def test_a_study_takes_the_rates_another_study_s_grid_chose(study, tmp_path, monkeypatch):
    """finetune.lr_from: a variant trains at the rate another study's committed grid chose for its family, else for
    its method (precise@3 takes 'precise'); it waits while that grid is incomplete, and a changed grid record makes it
    stale."""
    from keyheads.errors import SettingError
    from keyheads.pipeline import variant_lr
    from keyheads.runfolder import RunFolder

    monkeypatch.chdir(tmp_path)  # a study's records are read from records/CONFIG-NAME/cells, as the command does
    small = json.loads((study / "study.yaml").read_text())
    small.update(out=str(tmp_path / "small"), variants=["precise"],
                 finetune={**small["finetune"], "lr_grid": {"precise": [1e-4, 3e-2]}, "validation": 3,
                           "max_steps": 4, "warmup_ratio": 0.0})
    Path("configs").mkdir()
    Path("configs/small.yaml").write_text(json.dumps(small))
    big = RunSettings.from_yaml(study / "study.yaml", out=str(tmp_path / "big"), variants=["precise@3", "random@3"],
                                finetune={"lr_from": "configs/small.yaml"})
    records = Path("records/big/cells")
    run_cell(big, records, "identify", progress=False)
    with pytest.raises(SettingError, match=r"not complete.*finetune/grid/precise/0\.0001"):
        variant_lr(big, RunFolder(Path(big.out)), "precise@3")
    [waiting] = [s for s in status(big, records) if s.cell.name == "finetune/precise@3"]
    assert waiting.state == "waiting" and "configs/small.yaml chooses for precise" in waiting.why
    small_cfg = RunSettings.from_yaml("configs/small.yaml")
    for name in ("identify", "finetune/grid/precise/0.0001", "finetune/grid/precise/0.03"):
        run_cell(small_cfg, Path("records/small/cells"), name, progress=False)
    grids = sorted(Path("records/small/cells").glob("finetune--grid--*/run/grid/precise/*/grid.json"))
    losses = {float(p.parent.name): json.loads(p.read_text())["validation_loss"] for p in grids}
    best = min(losses, key=losses.get)
    assert variant_lr(big, RunFolder(Path(big.out)), "random@3") == best
    run_cell(big, records, "finetune/precise@3", progress=False)
    info = json.loads((records / "finetune--precise@3" / "run" / "finetune" / "precise@3" / "finetune.json")
                      .read_text())
    assert info["config"]["lr"] == best and states(big, records)["finetune/precise@3"] == "done"
    # the other study's grid changed (re-run, say): the variant trained at its old choice is stale
    point = next(p for p in grids if float(p.parent.name) != best)
    point.write_text(json.dumps({**json.loads(point.read_text()), "validation_loss": -1.0}))
    assert states(big, records)["finetune/precise@3"] == "stale"

"""`keyheads run` on two CPU processes (gloo, torchrun) writes the run folder that one process writes.

Both runs write into the same path (one after the other, each then moved aside), so the paths
recorded inside the files agree too. What is compared, file by file:
- bit for bit: the pairs, identify/, knockout/, attention/, mlp/, config.json, model.json, and the
  stage records of those stages. Patching and knockout hand whole batches and whole knockout sets
  to the processes, each computed exactly as one process computes it; attention, MLPs and the data
  run on the main process alone.
- within TOL: the fine-tuned adapter, the losses and the evaluation scores. Two DDP processes sum
  the gradient of the global batch in another order than one process does.
- left out, with the reason: in the stage records, "seconds" and "finished" (timings) and "machine"
  (where it ran); in finetune.json, the timings and "processes" (the process count itself);
  in the evaluation, "timing" (which process computed an item and which found it in the cache),
  the training speed, and the fine-tuned variant's "fingerprint" (a hash of the adapter's bytes,
  equal only within TOL); report.html (it shows those timings); eval/cache/ (one SQLite file that
  both processes append to: its rows are compared instead, by variant and item, since their order
  depends on who finished first); identify/per_sample*.npz (the patching checkpoint, one per
  process, which the stage records leave out for that reason).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed
from safetensors.torch import load_file

from keyheads.cli import main
from keyheads.evaluation.cache import read_rows
from keyheads.testing import tiny_model

from tests.helpers import assert_json_close, make_rows, write_rows, write_tiny_benchmarks

WORKER = Path(__file__).with_name("dist_worker.py")
TOL = 1e-5
STAGES = ["data", "identify", "knockout", "attention", "mlp", "finetune--precise", "eval", "report"]
SPREAD = {"identify", "knockout", "finetune", "eval"}  # the stages every process works on
CHECKPOINTS = re.compile(r"identify/per_sample.*\.npz")
EXACT = ["pairs.jsonl", "config.json", "model.json", "identify", "knockout", "attention", "mlp"]
RECORD_VARIES = ("seconds", "finished", "machine")
TRAIN_VARIES = ("seconds_this_run", "samples_per_second", "wall_seconds", "processes")
EVAL_VARIES = ("timing", "train_speed", "fingerprint")
SPEED = re.compile(r"\d+(\.\d+)? sam\./s")

pytestmark = [pytest.mark.distributed, pytest.mark.slow,
              pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                                 reason="torch.distributed with gloo is not available")]


def write_config(root: Path) -> Path:
    model = tiny_model("llama", seed=0)
    model.hf.save_pretrained(root / "model")
    model.tokenizer.save_pretrained(root / "model")
    write_rows(root / "given_pairs.jsonl", make_rows(16))
    (root / "train.jsonl").write_text("".join(json.dumps({"prompt": f"{a} + 1 = ", "completion": str(a + 1)}) + "\n"
                                              for a in range(8)))
    (root / "benchmarks").mkdir()
    write_tiny_benchmarks(root / "benchmarks")
    config = {"model": str(root / "model"), "out": str(root / "run"), "batch_size": 4,
              "data_dir": str(root / "benchmarks"),
              "identify": {"top_k": 3}, "knockout": {"k": 3, "seeds": 2, "limit": None, "transfer_n": 4},
              "attention": {"limit": None}, "mlp": {"limit": None}, "variants": ["precise"],
              "finetune": {"train": str(root / "train.jsonl"), "max_steps": 3, "optimizer_batch_size": 4,
                           "micro_batch_size": 1},
              "eval": {"benchmarks": ["mmlu", "arith-add"], "limit": 4, "few_shot": 1}}
    path = root / "run.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def argv(config: Path, out: Path | None = None) -> list[str]:
    # one torch thread, as in each worker: the same kernels, so that the same batch gives the same bits
    return ["run", str(config), "--threads", "1", "--quiet"] + (["--out", str(out)] if out else [])


def launch(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run the launcher in its own session; past `timeout` (a hang) end it and its workers, and fail."""
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"the processes still ran after {timeout} s:\n{out[-3000:]}\n{err[-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same `keyheads run` in one process (this one) and in two; -> (root, facts per rank, output)."""
    root = tmp_path_factory.mktemp("run")
    config = write_config(root)
    spec = root / "spec.json"
    spec.write_text(json.dumps({"results": str(root / "results"), "study": {
        "argv": argv(config), "fail_argv": argv(config, root / "fails"), "fail_out": str(root / "fails"),
        "spread_fail_out": str(root / "fails-spread"), "pairs": str(root / "given_pairs.jsonl")}}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc_per_node", "2",
           str(WORKER), str(spec)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    proc = launch(cmd, env, timeout=240)
    seconds = time.perf_counter() - t0
    # the workers end with a failure on one process (dist_worker.fail_on_one_process), after the results
    done = (root / "results" / "rank0.json").is_file() and (root / "results" / "rank1.json").is_file()
    assert proc.returncode == 1 and done, f"workers failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                                          f"{proc.stderr[-6000:]}"
    (root / "run").rename(root / "two")
    facts = [json.loads((root / "results" / f"rank{r}.json").read_text())["study"] for r in range(2)]

    threads = torch.get_num_threads()
    mp = pytest.MonkeyPatch()
    mp.setattr("keyheads.pipeline._data", lambda cfg, run, model, progress=True:
               shutil.copy(root / "given_pairs.jsonl", run / "pairs.jsonl"))
    try:
        assert main(argv(config)) == 0
    finally:
        mp.undo()
        torch.set_num_threads(threads)
    (root / "run").rename(root / "one")
    return root, facts, proc, seconds


def files(folder: Path) -> dict[str, Path]:
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*"))
            if p.is_file() and not CHECKPOINTS.fullmatch(p.relative_to(folder).as_posix())}


def test_the_two_folders_hold_the_same_files(runs):
    root, _, _, _ = runs
    one, two = files(root / "one"), files(root / "two")
    assert sorted(one) == sorted(two)
    assert [p.name for p in sorted((root / "two" / "identify").glob("per_sample*"))] == \
        ["per_sample.rank0of2.npz", "per_sample.rank1of2.npz"]
    assert {f"stages/{s}.json" for s in STAGES} <= set(two)
    assert not [f for f in two if f.endswith(".started") or "rank" in f]  # no leftovers, no other per-process file


def test_deterministic_stages_are_bit_for_bit_equal(runs):
    root, _, _, _ = runs
    one, two = files(root / "one"), files(root / "two")
    exact = [f for f in two if any(f == e or f.startswith(e + "/") for e in EXACT)]
    assert len(exact) > 15
    for f in exact:
        assert one[f].read_bytes() == two[f].read_bytes(), f"{f} differs"
    for name in STAGES:
        rec1, rec2 = (json.loads((root / r / "stages" / f"{name}.json").read_text()) for r in ("one", "two"))
        for key in RECORD_VARIES:
            rec1.pop(key), rec2.pop(key)
        if name in ("eval", "report"):  # their inputs include the fine-tuned files, equal only within TOL
            assert rec1["settings"] == rec2["settings"] and sorted(rec1["inputs"]) == sorted(rec2["inputs"])
            assert {k: v for k, v in rec1["inputs"].items() if not k.startswith(("finetune", "eval"))} == \
                   {k: v for k, v in rec2["inputs"].items() if not k.startswith(("finetune", "eval"))}
            continue
        if name.startswith("finetune"):  # the same signature; the outputs are compared below
            rec1.pop("outputs"), rec2.pop("outputs")
        assert rec1 == rec2, name


def close(a, b, path="") -> None:
    """Equal JSON, numbers within TOL."""
    assert_json_close(a, b, TOL, path)


def drop(obj, keys):
    if isinstance(obj, dict):
        return {k: drop(v, keys) for k, v in obj.items() if k not in keys}
    if isinstance(obj, list):
        return [drop(v, keys) for v in obj]
    return obj


def test_training_and_evaluation_agree_within_the_tolerance(runs):
    root, _, _, _ = runs
    one, two = root / "one", root / "two"
    a, b = (load_file(str(r / "finetune" / "precise" / "adapter.safetensors")) for r in (one, two))
    assert sorted(a) == sorted(b)
    assert max(float(t.abs().max()) for t in a.values()) > 1e-4  # it trained: the comparison is not of zeros
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=TOL), (k, (a[k] - b[k]).abs().max())
    info1, info2 = (json.loads((r / "finetune" / "precise" / "finetune.json").read_text()) for r in (one, two))
    assert (info1["train"]["processes"], info2["train"]["processes"]) == (1, 2)
    close(drop(info1, TRAIN_VARIES), drop(info2, TRAIN_VARIES))
    others = [f for f in files(two) if f.startswith("eval/") and not f.startswith("eval/cache/")]
    assert "eval/results.json" in others and len(others) > 5
    for f in others:
        if f.endswith(".json"):
            close(*(drop(json.loads((r / f).read_text()), EVAL_VARIES) for r in (one, two)), f)
        elif f.endswith(".jsonl"):
            close(*([json.loads(line) for line in (r / f).read_text().splitlines()] for r in (one, two)), f)
        else:
            assert SPEED.sub("-", (one / f).read_text()) == SPEED.sub("-", (two / f).read_text()), f
    rows = [json.loads((r / "eval" / "results.json").read_text())["variants"] for r in (one, two)]
    assert [v["fingerprint"] for v in rows[0][:2]] == [v["fingerprint"] for v in rows[1][:2]]  # base, knockout
    for bench in ("mmlu", "arith-add"):
        rows1, rows2 = (read_rows(r / "eval" / "cache" / f"{bench}.sqlite") for r in (one, two))
        assert len(rows2) == len({r["key"] for r in rows2}) == 3 * 4  # every item once: 3 variants, limit 4
        # the fine-tuned variant's keys hold its fingerprint: its items are matched by label and id
        close(*({(r["variant"], r["id"]): drop(r, ("key",)) for r in rows} for rows in (rows1, rows2)))


def test_every_process_works_on_the_spread_stages_and_only_the_main_one_on_the_rest(runs):
    _, facts, proc, _ = runs
    assert [f["code"] for f in facts] == [0, 0], [f["error"] for f in facts]
    main_calls, other_calls = facts[0]["calls"], facts[1]["calls"]
    assert set(main_calls) == {"data", "identify", "knockout", "attention", "mlp", "finetune", "eval", "report"}
    assert set(other_calls) == SPREAD
    for name in SPREAD:  # each made forward passes of its own
        assert facts[0]["forwards"].get(name, 0) > 0 and facts[1]["forwards"].get(name, 0) > 0, name
    assert set(facts[1]["forwards"]) == SPREAD
    assert facts[0]["devices"] and {d for f in facts for d in f["devices"]} == {"cpu"}  # distributed.default_device()
    assert proc.stdout.count("done; ran data, identify") == 1  # printed by the main process only


def test_a_failure_on_the_main_process_stops_every_process_with_a_message(runs):
    _, facts, proc, _ = runs
    assert [f["fail"][0] for f in facts] == [2, 2]
    assert "keyheads run: error: no pairs in this test" in proc.stderr
    assert ("keyheads run: error: the main process failed in stage data (UserError: no pairs in this test)"
            in proc.stderr)


def test_a_failure_inside_a_spread_stage_on_one_process_ends_the_job_with_its_message(runs):
    _, _, proc, _ = runs
    assert "[knockout] failed on process 1 of 2: RuntimeError: simulated failure on process 1" in proc.stderr
    assert "the run went on" not in proc.stderr
    # its peer, waiting inside the stage for its share, does not wait forever (the job ended: `launch` has a
    # timeout): it fails in its next collective and says so, or, when the launcher is quicker, is stopped by it
    assert ("[knockout] failed on process 0 of 2: RuntimeError" in proc.stderr
            or "closing signal SIGTERM" in proc.stderr), proc.stderr[-3000:]


def test_a_folder_of_two_processes_is_up_to_date_for_one(runs, tmp_path, capsys, monkeypatch):
    """The signatures hold nothing about the processes: one process re-runs nothing of what two did."""
    root, _, _, seconds = runs
    assert seconds < 90, f"the two-process run took {seconds:.0f} s"
    shutil.copytree(root / "two", root / "run")
    try:
        capsys.readouterr()
        monkeypatch.setattr("keyheads.models.loading.load_model", lambda *a, **k: pytest.fail("a stage ran again"))
        assert main(argv(root / "run.yaml")) == 0
        out = capsys.readouterr().out  # `keyheads run` prints the run's progress
        assert "done; ran nothing" in out and out.count("] up to date") == len(STAGES)
    finally:
        shutil.rmtree(root / "run")

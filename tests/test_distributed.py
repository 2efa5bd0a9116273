"""Several processes: two CPU processes (gloo, torchrun) give the same patching effects and the same
evaluation table as one process, resume per process, and keyheads.distributed shares and gathers."""
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed

from keyheads import distributed
from keyheads.cli import main
from keyheads.evaluation.cache import read_rows
from keyheads.testing import tiny_model

WORKER = Path(__file__).with_name("dist_worker.py")
BATCH = 2
# single-token answers (the tiny tokenizer spells numbers digit by digit) in two prompt lengths
PAIRS = [(f"{a} + {b} = ", f"{a} @ {b} = ", str(a + b)) for a, b in [(3, 4), (5, 2), (1, 1), (2, 6), (4, 4), (0, 9)]]
PAIRS += [(f"Q: {a} + {b}? A: ", f"Q: {a} @ {b}? A: ", str(a + b)) for a, b in [(4, 4), (1, 2), (6, 3), (2, 2)]]
ADDSUB = [("Tom has 2 cats and 3 dogs. How many pets?", 5), ("Ann has 4 pens and buys 3. How many now?", 7),
          ("Sam had 9 cards and lost 4. How many left?", 5), ("A box holds 6 eggs. How many in 2 boxes?", 12),
          ("Kim has 8 apples and eats 1. How many left?", 7), ("Joe has 3 hats and gets 3. How many hats?", 6),
          ("Liz had 7 cups and broke 2. How many now?", 5), ("Max has 5 toys and 4 more. How many toys?", 9)]

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                                 reason="torch.distributed with gloo is not available")]


def write_inputs(root: Path) -> dict:
    model = tiny_model("llama", seed=0)
    folder = root / "model"
    model.hf.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    pairs = root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"reference": r, "counterfactual": c, "answer": a}) + "\n"
                             for r, c, a in PAIRS))
    data = root / "benchmarks"
    (data / "gsm8k").mkdir(parents=True)
    (data / "gsm8k" / "train.jsonl").write_text(json.dumps(
        {"question": "Bo has 2 pens and 2 more. How many?", "answer": "2+2=<<2+2=4>>4\n#### 4"}) + "\n")
    (data / "addsub").mkdir()
    (data / "addsub" / "AddSub.json").write_text(json.dumps(
        [{"iIndex": i, "sQuestion": q, "lEquations": [f"X={a}"], "lSolutions": [str(a)]}
         for i, (q, a) in enumerate(ADDSUB)]))
    return {"model": folder, "pairs": pairs, "data": data}


def patch_argv(inputs: dict, out: Path) -> list[str]:
    return ["identify", "--model", str(inputs["model"]), "--data", str(inputs["pairs"]), "--out", str(out),
            "--batch-size", str(BATCH), "--top-k", "3"]


def eval_argv(inputs: dict, out: Path, cache: Path) -> list[str]:
    return ["eval", "--model", str(inputs["model"]), "--knockout", "0.1,2.3", "--knockout-data", str(inputs["pairs"]),
            "--benchmarks", "addsub", "--few-shot", "1", "--max-new-tokens", "4", "--batch-size", "3",
            "--data-dir", str(inputs["data"]), "--cache-dir", str(cache), "--out", str(out), "--quiet"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same patch and eval commands in two processes (see dist_worker.py) and in this one."""
    root = tmp_path_factory.mktemp("distributed")
    inputs = write_inputs(root)
    spec = root / "spec.json"
    spec.write_text(json.dumps({"identify": patch_argv(inputs, root / "patch2"),
                                "eval": eval_argv(inputs, root / "eval2", root / "cache2"),
                                "results": str(root / "results")}))
    # `accelerate launch --cpu --num_processes 2` starts ONE process without an MPI hostfile, so
    # torch's own launcher starts the two; accelerate's PartialState reads what it sets.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc_per_node", "2",
           str(WORKER), str(spec)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"workers failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    facts = [json.loads((root / "results" / f"rank{r}.json").read_text()) for r in range(2)]
    assert main(patch_argv(inputs, root / "patch1")) == 0
    assert main(eval_argv(inputs, root / "eval1", root / "cache1")) == 0
    return root, inputs, facts, proc.stdout


def batch_indices(inputs) -> list[list[int]]:
    from keyheads.models import load_model
    from keyheads.patching.samples import batches, load_patch_samples

    model = load_model(str(inputs["model"]), device="cpu")
    return [list(b.index) for b in batches(load_patch_samples(model, inputs["pairs"]), BATCH, "cpu")]


def test_distributed_helpers_on_two_ranks(runs):
    _, _, facts, _ = runs
    d0, d1 = (f["distributed"] for f in facts)
    for r, d in enumerate((d0, d1)):
        assert d["launched"] and d["rank"] == r and d["world"] == 2
        assert d["backend"] == "gloo" and d["device"] == "cpu"
        assert d["full"] == [0, 10, 20, 30, 40, 50, 60]  # the whole list, in order, on every rank
        assert d["empty"] == [] and d["one"] == [50]
        assert d["gathered"] == [[0, 1, 2], [1, 2, 3]]
        assert "non-negative" in d["bad_n"]
    assert d0["shard7"] == [0, 2, 4, 6] and d1["shard7"] == [1, 3, 5]
    assert d0["calls"] == [[0, 2, 4, 6], [5]] and d1["calls"] == [[1, 3, 5]]  # not called for an empty share
    # an error on one rank reaches every rank instead of leaving the others waiting
    assert d0["error"] == "RuntimeError: rank 1 of 2 failed: ValueError: bad item"
    assert d1["error"] == "ValueError: bad item"
    assert d0["wrong_length"] == "ValueError: map_sharded: fn returned 0 results for 2 items"
    assert d1["wrong_length"].startswith("RuntimeError: rank 0 of 2 failed: ValueError")


def test_two_processes_give_the_same_effects(runs):
    root, _, facts, stdout = runs
    one = json.loads((root / "patch1" / "effects.json").read_text())
    two = json.loads((root / "patch2" / "effects.json").read_text())
    assert one["n_samples"] == two["n_samples"] == len(PAIRS)
    for key in ("heads", "mlps"):
        diff = np.abs(np.asarray(one[key]) - np.asarray(two[key])).max()
        assert diff <= 1e-6, (key, diff)
    assert np.abs(np.asarray(one["heads"])).max() > 1e-3  # not trivially equal
    keys1, keys2 = (json.loads((root / f / "key_heads.json").read_text()) for f in ("patch1", "patch2"))
    assert keys1["heads"] == keys2["heads"] and len(keys2["heads"]) == 3
    # the main process alone writes the outputs, and prints them once
    assert (root / "patch2" / "heatmap.png").is_file() and (root / "patch2" / "effects.csv").is_file()
    assert stdout.count("path patching, metric relative-logit") == 2  # the resume and the restart
    # each process keeps its own checkpoint; the one-process name is not used
    names = sorted(p.name for p in (root / "patch2").glob("per_sample*.npz"))
    assert names == ["per_sample.rank0of2.npz", "per_sample.rank1of2.npz"]
    assert json.loads(facts[0]["identify"]["effects_after_resume"]) == two  # the restart changed nothing


def test_each_process_resumes_its_own_share(runs):
    _, inputs, facts, _ = runs
    batches = batch_indices(inputs)
    n = len(batches)
    assert n >= 4, "the test needs two batches per rank"
    mine = [math.ceil(n / 2), n // 2]
    p0, p1 = (f["identify"] for f in facts)
    # rank 1 crashed at its second batch; rank 0 finished its share; both stopped with the error
    assert p1["crash"] == "RuntimeError: simulated crash" and p1["crash_calls"] == 2
    assert p0["crash"] == "RuntimeError: rank 1 of 2 failed: RuntimeError: simulated crash"
    assert p0["crash_calls"] == mine[0]
    # (a rank that started later may also hold what the other had checkpointed by then)
    rank0 = {i for b in batches[0::2] for i in b}
    assert rank0 <= set(p0["checkpointed"]) and set(batches[1]) <= set(p1["checkpointed"])
    assert not set(batches[3]) & (set(p0["checkpointed"]) | set(p1["checkpointed"]))  # rank 1's unfinished batch
    # the re-run computes only rank 1's remaining batches; --restart computes everything again
    assert (p0["resume"]["calls"], p1["resume"]["calls"]) == (0, mine[1] - 1)
    assert (p0["restart"]["calls"], p1["restart"]["calls"]) == tuple(mine)
    assert all(p[k]["code"] == 0 for p in (p0, p1) for k in ("resume", "restart"))


def test_one_process_resumes_from_two(runs, tmp_path, monkeypatch, capsys):
    """Samples are independent, so one process finishes, or reuses, what two processes did."""
    import keyheads.patching.sweep as sweep_module

    root, inputs, _, _ = runs
    out = tmp_path / "run"
    shutil.copytree(root / "patch2", out)
    for name in ("effects.json", "key_heads.json"):
        (out / name).unlink()
    calls = {"n": 0}
    real = sweep_module.PATCH_METHODS["path"]

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setitem(sweep_module.PATCH_METHODS, "path", counting)
    assert main(patch_argv(inputs, out)) == 0
    assert calls["n"] == 0
    assert f"resuming: {len(PAIRS)}/{len(PAIRS)} samples already done in 2 checkpoints" in capsys.readouterr().err
    assert json.loads((out / "effects.json").read_text()) == json.loads((root / "patch2" / "effects.json").read_text())
    assert not (out / "per_sample.npz").exists()  # nothing new was computed, so nothing to checkpoint


def test_two_processes_give_the_same_table(runs):
    root, _, facts, stdout = runs
    assert [f["eval"]["code"] for f in facts] == [0, 0], [f["eval"]["error"] for f in facts]
    table = (root / "eval2" / "table.md").read_text()
    assert table == (root / "eval1" / "table.md").read_text()
    assert stdout.count(table) == 1  # printed by the main process only
    one, two = (json.loads((root / f / "results.json").read_text()) for f in ("eval1", "eval2"))
    assert [v["benchmarks"]["addsub"]["n"] for v in two["variants"]] == [len(ADDSUB)] * 2
    assert [v["benchmarks"]["addsub"]["accuracy"] for v in two["variants"]] == \
        [v["benchmarks"]["addsub"]["accuracy"] for v in one["variants"]]
    assert "shard" not in two["config"]  # a caller's argument, not a setting of the table

    def rows(cache):
        return read_rows(root / cache / "addsub.sqlite")

    rows1, rows2 = rows("cache1"), rows("cache2")
    assert len({r["key"] for r in rows2}) == len(rows2) == 2 * len(ADDSUB)  # every item once, by one rank
    added = [f["eval"]["rows_added"] for f in facts]
    assert sum(added) == len(rows2) and min(added) > 0  # both ranks did part of the work
    assert {r["key"]: r for r in rows1} == {r["key"]: r for r in rows2}  # the same generations


def test_one_process_needs_no_process_group(monkeypatch):
    if torch.distributed.is_initialized():  # FSDP2 on one process, in a test before this one, made its group of one
        torch.distributed.destroy_process_group()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not distributed.launched()
    assert (distributed.rank(), distributed.world(), distributed.is_main()) == (0, 1, True)
    assert distributed.default_device() is None and not torch.distributed.is_initialized()
    assert distributed.shard(3) == [0, 1, 2] and distributed.gather({"a": 1}) == [{"a": 1}]
    assert distributed.map_sharded(lambda sub: [s.upper() for s in sub], ["a", "b"]) == ["A", "B"]
    assert distributed.broadcast([1, 2]) == [1, 2] and distributed.on_main(lambda: 7) == 7
    with pytest.raises(KeyError):  # the main process's own error, as it was
        distributed.on_main(lambda: {}["x"])
    with pytest.raises(ValueError, match="returned 1 results for 2 items"):
        distributed.map_sharded(lambda sub: sub[:1], ["a", "b"])
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="non-negative int"):
            distributed.shard(bad)

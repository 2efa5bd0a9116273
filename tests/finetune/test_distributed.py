"""Two CPU processes (gloo DDP) compute the same training as one process given the same global batch:
each takes every second sample, the gradient is averaged back to the global-batch mean, and both
end with the same deltas. Only the trained slices are reduced; only the main process writes files."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed
from safetensors.torch import load_file

from keyheads.components import Components
from keyheads.finetune.adapter import ADAPTER, INFO
from keyheads.finetune.run import finetune
from keyheads.finetune.settings import FinetuneSettings
from keyheads.testing import tiny_model

COMPONENTS = Components(((1, 0), (1, 1), (2, 3)), (2,))
# The recipe (AdamW, clipping), and plain SGD without clipping: AdamW with clipping hardly sees the
# scale of the gradient, SGD moves by it, so a wrongly scaled DDP loss shows there.
RUNS = {"adamw": FinetuneSettings(max_steps=3, save_every=2, optimizer_batch_size=8, micro_batch_size=2, lr=1e-2),
        "sgd": FinetuneSettings(max_steps=3, save_every=2, optimizer_batch_size=8, micro_batch_size=2, lr=0.5,
                                optimizer="sgd",
                              max_grad_norm=0.0, warmup_ratio=0.0)}
WORKER = Path(__file__).with_name("ddp_worker.py")

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                                 reason="torch.distributed with gloo is not available")]


@pytest.fixture(scope="module")
def two_processes(examples, tmp_path_factory):
    """Run ddp_worker.py in two processes; -> name -> (output folder, per-rank tensors, per-rank facts)."""
    root = tmp_path_factory.mktemp("ddp")
    spec = root / "spec.json"
    spec.write_text(json.dumps({"examples": [{"prompt": e.prompt, "completion": e.completion} for e in examples],
                                "components": COMPONENTS.to_json(),
                                "runs": {name: cfg.to_json() for name, cfg in RUNS.items()}}))
    out, results = root / "out", root / "results"
    # `accelerate launch --cpu --num_processes 2` starts ONE process unless given an MPI hostfile
    # (accelerate 1.x simple_launcher), so torch's own launcher starts the two; Accelerate reads
    # the WORLD_SIZE/RANK/MASTER_* variables it sets and picks MULTI_CPU with gloo.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc_per_node", "2",
           str(WORKER), str(spec), str(out), str(results)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"workers failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return {name: (out / name, [load_file(str(results / name / f"rank{r}.safetensors")) for r in range(2)],
                   [json.loads((results / name / f"rank{r}.json").read_text()) for r in range(2)])
            for name in RUNS}


@pytest.mark.parametrize("name", list(RUNS))
def test_two_processes_match_one(name, two_processes, examples, tmp_path):
    out, tensors, facts = two_processes[name]
    assert [f["world"] for f in facts] == [2, 2] and [f["rank"] for f in facts] == [0, 1]
    assert all(f["backend"] == "gloo" and f["distributed_type"].endswith("MULTI_CPU") for f in facts)
    # The ranks agree exactly (DDP gives every rank the same averaged gradient).
    assert set(tensors[0]) == set(tensors[1])
    for key in tensors[0]:
        assert torch.equal(tensors[0][key], tensors[1][key]), key
    assert facts[0]["losses"] == facts[1]["losses"]

    model = tiny_model("llama", seed=0)
    info = finetune(model, examples, RUNS[name], tmp_path / "single", COMPONENTS, progress=False)
    single = {n: p.detach() for n, p in model.hf.named_parameters() if p.requires_grad}
    assert set(single) == set(tensors[0])
    worst = max((single[n] - tensors[0][n]).abs().max().item() for n in single)
    assert worst < 1e-5, worst
    assert max(t.abs().max().item() for n, t in single.items() if "keyheads_delta" in n) > 1e-3  # deltas moved
    assert info.train.losses == pytest.approx(facts[0]["losses"], abs=1e-5)


def test_only_trained_slices_are_reduced(two_processes):
    """DDP registers only parameters that require a gradient: the frozen base is never all-reduced."""
    for _, _, facts in two_processes.values():
        for f in facts:
            assert f["is_ddp"]
            assert f["find_unused_parameters"] is False
            assert f["broadcast_buffers"] is False  # the deltas' W0 copies are not re-sent every forward
            assert f["ddp_reduced_ids_are_trainable"]
            assert f["ddp_num_parameter_tensors"] == f["n_trainable_tensors"] < f["n_model_tensors"]
            assert f["ddp_total_parameter_size_bytes"] == f["n_trainable_bytes"]


def test_main_process_writes_once(two_processes):
    for name, (out, tensors, facts) in two_processes.items():
        assert facts[0]["writes"] == {"adapter": 1, "info": 1, "checkpoint": 1}  # the checkpoint of step 2 of 3
        assert facts[1]["writes"] == {"adapter": 0, "info": 0, "checkpoint": 0}
        info = json.loads((out / INFO).read_text())
        assert info["train"]["processes"] == 2 and info["train"]["steps"] == RUNS[name].max_steps
        assert sorted(p.name for p in out.iterdir()) == sorted([ADAPTER, INFO])  # no temporaries, no checkpoint
        adapter = load_file(str(out / ADAPTER))
        mlp = {k.removeprefix("mlp."): v for k, v in adapter.items() if k.startswith("mlp.")}
        assert mlp and all(torch.equal(v, tensors[0][k]) for k, v in mlp.items())
        assert sum(k.startswith("delta.") and k.endswith(".weight") for k in adapter) == \
            sum(k.endswith("keyheads_delta.weight") for k in tensors[0])

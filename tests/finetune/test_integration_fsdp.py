"""Precise SFT through a plain transformers Trainer under FSDP2 on two CPU processes (`accelerate launch
--use_fsdp --fsdp_version 2`, gloo) trains what one process without FSDP trains.

The worker (trainer_worker.py) is a user's script: `attach`, then `Trainer(optimizer_cls_and_kwargs=
sft.optimizer_cls_and_kwargs(args), callbacks=[sft.callback(out)])`. accelerate shards every decoder layer
and the root with `fully_shard`, which replaces every parameter (the deltas too) by a DTensor shard and
computes with gathered copies, and moves the optimizer onto the shards. The H/h gradient hooks must then
still act, the decay of W0 + delta must act shard by shard, and the callback must gather the shards and
write one whole adapter, from the first process only.

Tolerance: 1e-5 on every adapter entry (largest absolute difference), the bound test_fsdp.py uses for
keyheads' own FSDP2 loop. The two processes see the same two micro-batches of two examples that the single
process accumulates, padded the same way, so each example's gradient is the same computation; what differs
is the order of float sums: the gradient norm for clipping is summed shard by shard and then across the
processes, and the reduce-scatter adds the two halves where the single process accumulates them. Those
differ in the last bits (about 1e-7 relative); AdamW's update is lr * m / (sqrt(v) + eps), of size lr =
1e-2 per step, so last-bit changes move an entry by about 1e-9 unless its gradient is near zero (1.3e-7
measured against one process, 9.7e-8 against `keyheads finetune`). Gradient hooks placed on the parameters
at `attach`, which FSDP2 replaces, never run: the adapter then differs by 2.8e-4 and the count of scaled
gradients is 0, and either fails this test.
"""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed
from safetensors.torch import load_file

from keyheads.finetune.adapter import ADAPTER, INFO
from keyheads.finetune.data import tokenize
from keyheads.finetune.layer import ATTR

from tests.finetune.test_integration import COMPONENTS, RECIPE, STEPS, in_keyheads_order, keyheads_run, model_folder
from tests.finetune.trainer_worker import train

WORKER = Path(__file__).with_name("trainer_worker.py")
TOL = 1e-5
MICRO = 2  # two processes x 2 examples = keyheads' optimizer batch of 4

pytestmark = [pytest.mark.distributed, pytest.mark.slow,  # two processes under accelerate launch, about 30 s
              pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                                 reason="torch.distributed with gloo is not available")]


def trainer_args(output_dir: Path, accumulation: int, rescale: bool = True) -> dict:
    """The trainer's arguments: keyheads' recipe, sequential order, a checkpoint at step 2."""
    return dict(output_dir=str(output_dir), per_device_train_batch_size=MICRO, gradient_accumulation_steps=accumulation,
                max_steps=STEPS, learning_rate=RECIPE["lr"], weight_decay=RECIPE["weight_decay"],
                max_grad_norm=RECIPE["max_grad_norm"], warmup_steps=RECIPE["warmup_ratio"], lr_scheduler_type="linear",
                seed=RECIPE["seed"], train_sampling_strategy="sequential", logging_steps=1, save_strategy="steps",
                save_steps=2, use_cpu=True, disable_tqdm=True, report_to="none")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(spec: dict, root: Path) -> subprocess.CompletedProcess:
    """`accelerate launch` with FSDP2 on two processes, each decoder layer its own FSDP unit."""
    path = root / "spec.json"
    path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--use_fsdp", "--fsdp_version", "2",
           "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
           str(WORKER), str(path), str(root / "results")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=root)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, examples):
    root = tmp_path_factory.mktemp("trainer-fsdp")
    folder = model_folder("llama", root)  # grouped K/V heads; no biases (see test_fsdp.py on AdamW and zero gradients)
    from transformers import AutoTokenizer

    rows = [{"input_ids": t.ids, "labels": [-100] * t.n_prompt + t.ids[t.n_prompt:]}
            for t in tokenize(AutoTokenizer.from_pretrained(folder), in_keyheads_order(examples), 1024)]
    return root, folder, rows


def run_fsdp(setup, name: str) -> tuple[Path, list[dict]]:
    root, folder, rows = setup
    work = root / name
    work.mkdir()
    spec = {"folder": str(folder), "components": COMPONENTS.to_json(), "rows": rows,
            "args": trainer_args(work / "trainer", accumulation=1), "out": str(work / "adapter")}
    proc = launch(spec, work)
    assert proc.returncode == 0, f"workers failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return work, [json.loads((work / "results" / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def fsdp(setup):
    return run_fsdp(setup, "fsdp")


def worst(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    for k in a:
        assert a[k].shape == b[k].shape, k
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def test_trainer_under_fsdp2_trains_what_one_process_trains(fsdp, setup, examples, tmp_path):
    work, ranks = fsdp
    root, folder, rows = setup
    # It ran as asked: two gloo processes, accelerate's FSDP2, every parameter (the deltas too) a DTensor shard.
    assert [f["rank"] for f in ranks] == [0, 1] and {f["world"] for f in ranks} == {2}
    assert {f["backend"] for f in ranks} == {"gloo"} and {f["fsdp_version"] for f in ranks} == {2}
    assert {f["distributed_type"] for f in ranks} == {"DistributedType.FSDP"}
    assert all(f["deltas_sharded"] and f["frozen_sharded"] for f in ranks)
    # One whole adapter per save, written by the first process only: into the trainer's checkpoints (step 2,
    # and the last step, which the Trainer also saves), then the end.
    assert ranks[0]["writes"] == [str(work / "trainer" / f"checkpoint-{step}") for step in (2, STEPS)] + [
        str(work / "adapter")]
    assert ranks[1]["writes"] == []

    # The same job on one process without FSDP: the same micro-batches, accumulated.
    model, _, trainer = train(folder, COMPONENTS, rows, trainer_args(tmp_path / "trainer", accumulation=2),
                              tmp_path / "adapter")
    # The H/h hooks acted on every delta tensor in every micro-batch, on each process (one micro-batch per step).
    n_deltas = sum(1 for n, _ in model.named_parameters() if ATTR in n)
    assert [f["rescaled_gradients"] for f in ranks] == [n_deltas * STEPS] * 2
    single, written = load_file(str(tmp_path / "adapter" / ADAPTER)), load_file(str(work / "adapter" / ADAPTER))
    assert max(v.abs().max().item() for k, v in single.items() if k.endswith(".weight")) > 1e-3  # it trained
    assert worst(written, single) < TOL  # 1.3e-7 measured
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    for f in ranks:
        assert f["losses"] == pytest.approx(losses, abs=1e-5)
    # ... and what `keyheads finetune` trains on one process in micro-batches of 2 (test_integration.py shows
    # the single-process Trainer equal to it; this closes the loop for the FSDP2 run).
    keyheads_run(folder, examples, tmp_path / "kh", micro=MICRO)
    assert worst(written, load_file(str(tmp_path / "kh" / ADAPTER))) < TOL  # 9.7e-8 measured
    # The checkpoint's adapter is whole too, and its record says step 2 of the two-process run.
    checkpoint = json.loads((work / "trainer" / "checkpoint-2" / INFO).read_text())
    assert checkpoint["train"]["steps"] == 2 and checkpoint["train"]["processes"] == 2
    assert worst(load_file(str(work / "trainer" / f"checkpoint-{STEPS}" / ADAPTER)), written) == 0
    assert {k: v.shape for k, v in load_file(str(work / "trainer" / "checkpoint-2" / ADAPTER)).items()} == {
        k: v.shape for k, v in single.items()}

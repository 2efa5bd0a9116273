"""The planner's bytes against what a tiny model really holds, and `keyheads plan` on the command line.

State terms (weights, gradients, AdamW state, W0 copies) must be exact. Saved activations per token are
measured with torch.autograd.graph.saved_tensors_hooks (every tensor autograd keeps for the backward
pass, each storage once) as the slope between two sequence lengths, so that per-step constants drop
out; the planner must be within ACTIVATION_TOLERANCE of it.
"""
from __future__ import annotations

import json
import weakref

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from keyheads.cli import main
from keyheads.components import Components
from keyheads.finetune.data import Tokenized, collate
from keyheads.finetune.model import full, lora, precise
from keyheads.finetune.train import completion_loss_sum
from keyheads.heads import Head
from keyheads.models.bundled import BUNDLED
from keyheads.planning import costs
from keyheads.planning.planner import Machine, Workload, make_plan
from keyheads.planning.shape import load_config, shape_of
from keyheads.testing import TINY_FAMILIES, tiny_model

ACTIVATION_TOLERANCE = 0.02  # relative; the counts were read off these very kernels, so they match exactly today
HEADS = (Head(0, 0), Head(1, 2), Head(2, 3))  # tiny Llama: 4 heads over 2 K/V heads, each here in a group of its own
WORK = Workload(micro_batch=2, heads=len(HEADS), mlps=1, lora_rank=4)
BIG = Machine(gpus=1, nodes=1, gpu_bytes=2**50, host_bytes=None)


def make(method: str, dtype=torch.bfloat16):
    model = tiny_model("llama", dtype=dtype)
    if method == "full":
        return full(model)
    if method == "lora":
        return lora(model, WORK.lora_rank)
    return precise(model, Components(heads=HEADS, mlps=(1,) if method == "precise+mlp" else ()))


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def one_step(tuned):
    """One AdamW step on one micro-batch, as finetune.train takes it."""
    opt = torch.optim.AdamW(tuned.param_groups(0.1), lr=1e-3)
    inputs = collate([Tokenized(list(range(4, 20)), 4), Tokenized(list(range(4, 15)), 4)], 0, "cpu")
    labels = inputs.pop("labels")
    completion_loss_sum(tuned.module(**inputs, use_cache=False).logits, labels).backward()
    opt.step()
    return opt


def planned(method: str, dtype: str = "bfloat16"):
    shape = shape_of(tiny_model("llama").hf.config)
    plan = make_plan(shape, BIG, Workload(**{**WORK.__dict__, "dtype": dtype}))
    stage = next(s for s in plan.stages if s.stage == f"finetune {method}")
    return stage, stage.options[0].memory  # DDP on one process: the whole model, no buckets


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_meta_count_equals_the_model(family):
    model = tiny_model(family)
    assert shape_of(model.hf.config).params == sum(p.numel() for p in model.hf.parameters())


@pytest.mark.parametrize("method", ["full", "precise", "precise+mlp", "lora"])
def test_state_bytes_are_exact(method):
    # The plan assumes fp32 trained weights under bf16 compute. Deltas and LoRA's A and B are fp32 on a bf16 base
    # today; whole trained weights (full SFT, MLPs) have the base's dtype, so those are checked on an fp32 base.
    dtype = torch.float32 if method in ("full", "precise+mlp") else torch.bfloat16
    tuned = make(method, dtype)
    opt = one_step(tuned)
    trained = [p for _, p in tuned.named_trainable()]
    frozen = [p for p in tuned.module.parameters() if not p.requires_grad]
    moments = [s[k] for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq")]
    assert all(s["step"].numel() == 1 for s in opt.state.values())  # one scalar per tensor, not counted
    stage, mem = planned(method, str(dtype).removeprefix("torch."))
    assert stage.trained_params == sum(p.numel() for p in trained)
    assert mem.trained == nbytes(trained)
    assert mem.grads == nbytes(p.grad for p in trained)
    assert mem.optimizer == nbytes(moments)
    assert mem.frozen == nbytes(frozen)
    assert mem.buffers == nbytes(d.base for d in tuned.deltas.values())


def saved_bytes(tuned, length: int) -> int:
    """Bytes of every storage autograd keeps for the backward pass, weights and buffers excluded."""
    module = tuned.module
    skip = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    # two samples, one a token short: a padded batch, as training has; every token but the first is a completion
    items = [Tokenized(list(range(4, 4 + length)), 1), Tokenized(list(range(4, 3 + length)), 1)]
    inputs = collate(items, 0, "cpu")
    labels = inputs.pop("labels")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        completion_loss_sum(module(**inputs, use_cache=False).logits, labels)
    return sum(seen.values())


@pytest.mark.parametrize("method", ["full", "precise", "precise+mlp", "lora"])
def test_saved_activations_per_token(method):
    short, long = 16, 48
    measured = (saved_bytes(make(method), long) - saved_bytes(make(method), short)) / (2 * (long - short))
    shape = shape_of(tiny_model("llama").hf.config)
    kind = "precise" if method.startswith("precise") else method
    # the padding mask grows with the square of the length: its slope between the two is short + long per token
    planned_bytes = costs.saved_train(shape, 2, short + long, 2, kind, len(HEADS), int(method == "precise+mlp"),
                                      WORK.lora_rank)
    assert planned_bytes == pytest.approx(measured, rel=ACTIVATION_TOLERANCE)


def run_plan(capsys, *args) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_on_a_tiny_folder(tmp_path, capsys):
    model = tiny_model("llama")
    model.hf.save_pretrained(tmp_path)
    code, out, _ = run_plan(capsys, "--model", str(tmp_path), "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["shape"]["params"] == sum(p.numel() for p in model.hf.parameters())
    assert all(s["chosen"] for s in plan["stages"])
    code, out, _ = run_plan(capsys, "--model", str(tmp_path))
    assert code == 0 and "finetune precise" in out and "--finetune.parallel ddp" in out


def test_bundled_model_from_its_gguf_header(tmp_path, monkeypatch):
    """Not converted yet: the config comes from the GGUF header, tied as conversion ties it."""
    if not BUNDLED["smollm2-135m"].installed():
        pytest.skip("the bundled smollm2-135m is not installed")
    monkeypatch.setenv("KEYHEADS_CACHE", str(tmp_path))
    shape = shape_of(load_config("smollm2-135m"))
    assert shape.params == 134_515_008 and shape.tied  # the count full SFT trains (bench/RESULTS.md)
    assert not (tmp_path / "models").exists()  # nothing converted


LLAMA2_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=32, vocab_size=32000)


def test_cli_llama2_7b_full_sft(tmp_path, capsys):
    transformers.LlamaConfig(**LLAMA2_7B).to_json_file(tmp_path / "config.json")  # config.json only
    code, out, _ = run_plan(capsys, "--model", str(tmp_path), "--gpus", "1", "--gpu-memory", "80GB", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["shape"]["params"] == 6_738_415_616
    modes = {o["mode"]: o for s in plan["stages"] if s["stage"] == "finetune full" for o in s["options"]}
    assert not modes["ddp"]["fits"] and modes["ddp"]["micro_batch"] == 1  # does not fit even one sample a pass
    assert modes["fsdp+offload"]["fits"]
    # 16 bytes a parameter go to the host: fp32 weights, gradients and two AdamW moments
    assert modes["fsdp+offload"]["memory"]["host"] == 16 * 6_738_415_616
    full_sft = next(s for s in plan["stages"] if s["stage"] == "finetune full")
    assert full_sft["chosen"] == "fsdp+offload"
    assert "--finetune.offload" in modes["fsdp+offload"]["flags"]
    # with too little host memory for the offloaded states, nothing fits one GPU
    code, out, _ = run_plan(capsys, "--model", str(tmp_path), "--host-memory", "64GiB", "--json")
    assert code == 0
    assert next(s for s in json.loads(out)["stages"] if s["stage"] == "finetune full")["chosen"] is None


@pytest.mark.parametrize("args, says", [
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--gpus", "0"], "--gpus 0: must be an integer >= 1"),
    (["--gpu-memory", "80GB?"], "--gpu-memory 80GB?: expected a positive size, e.g. 80GiB"),
    (["--host-memory", "lots"], "--host-memory lots: expected a positive size"),
])
def test_cli_bad_input(capsys, args, says):
    code, _, err = run_plan(capsys, *args)
    assert code == 2
    assert says in err and len(err.strip().splitlines()) == 1


class CreatedBytes(TorchDispatchMode):
    """The peak bytes of the tensors that ops create while the mode is on (views and in-place results excluded),
    each counted until Python drops it."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given:
                n = t.untyped_storage().nbytes()
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, n)
        return out


@pytest.mark.parametrize("method", ["full", "precise", "precise+mlp", "lora"])
def test_adamw_step_temporaries_are_one_fp32_copy_of_the_trained_weights(method):
    # On a GPU torch.optim.AdamW takes its foreach path by default; here it is asked for, on the CPU. The second step
    # is measured: the first also creates the moments, which the plan counts as optimizer state.
    tuned = make(method, torch.float32)
    opt = torch.optim.AdamW(tuned.param_groups(0.1), lr=1e-3, foreach=True)
    for _, p in tuned.named_trainable():
        p.grad = torch.randn_like(p)
    opt.step()
    with CreatedBytes() as created:
        opt.step()
    _, mem = planned(method, "float32")
    largest_group = max(nbytes(group["params"]) for group in opt.param_groups)
    assert created.peak == pytest.approx(largest_group, rel=0.01)
    assert largest_group <= mem.step <= 1.01 * largest_group  # full SFT: the plan adds the norms' small group

"""--optimizer adamw8bit: bitsandbytes' AdamW with 8-bit moments, for full SFT where fp32 AdamW does not fit.
Its moments of large tensors are uint8, its first step is AdamW's within the quantisation error, and a killed
run resumes bit-identical (the 8-bit states and their scales go through the checkpoint)."""
import pytest
import torch

import keyheads.finetune.train as train_mod
from keyheads.finetune.run import finetune
from keyheads.finetune.settings import FinetuneSettings
from keyheads.testing import tiny_model

from tests.helpers import Killed, kill_at_optimizer_step

pytest.importorskip("bitsandbytes")
CFG = FinetuneSettings(method="full", optimizer="adamw8bit", max_steps=4, save_every=2, optimizer_batch_size=8,
                     micro_batch_size=4, lr=1e-3, warmup_ratio=0.0, weight_decay=0.0)


def weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.hf.named_parameters()}


def test_moments_are_8bit_and_the_first_step_is_adamws(examples, tmp_path, monkeypatch):
    made = []
    real = train_mod.make_optimizer
    monkeypatch.setattr(train_mod, "make_optimizer", lambda tuned, cfg: made.append(real(tuned, cfg)) or made[-1])
    updates = {}
    for name in ("adamw", "adamw8bit"):
        model = tiny_model("llama", seed=0)
        before = weights(model)
        cfg = FinetuneSettings(**{**CFG.to_json(), "optimizer": name, "max_steps": 1, "save_every": 0})
        finetune(model, examples, cfg, tmp_path / name, progress=False)
        updates[name] = {n: p - before[n] for n, p in weights(model).items()}
    state = made[-1].state
    big = [p for p in state if p.numel() >= 4096]
    assert big and all(state[p]["state1"].dtype == torch.uint8 and state[p]["state2"].dtype == torch.uint8
                       for p in big)
    for n, exact in updates["adamw"].items():
        # AdamW's first step moves each entry by about lr; 8-bit moments may change that by a few percent
        assert (updates["adamw8bit"][n] - exact).abs().max().item() < 0.1 * CFG.lr, n
    assert max(u.abs().max().item() for u in updates["adamw"].values()) > 0.5 * CFG.lr


def test_a_killed_8bit_run_resumes_bit_identical(examples, tmp_path, monkeypatch):
    whole = tiny_model("llama", seed=0)
    finetune(whole, examples, CFG, tmp_path / "whole", progress=False)

    kill_at_optimizer_step(monkeypatch, 3)  # after the checkpoint of step 2
    with pytest.raises(Killed):
        finetune(tiny_model("llama", seed=0), examples, CFG, tmp_path / "run", progress=False)
    monkeypatch.undo()
    resumed = tiny_model("llama", seed=0)
    info = finetune(resumed, examples, CFG, tmp_path / "run", progress=False)
    assert info.train.steps_this_run == 2
    a, b = weights(resumed), weights(whole)
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_the_largest_tensor_is_updated_last_with_every_other_gradient_freed_and_the_same_weights(examples):
    """make_optimizer's 8-bit AdamW frees each gradient after its update and takes the largest tensor
    last (the memory peak of bitsandbytes' CPU kernel); each update is still the library's own."""
    import bitsandbytes

    from keyheads.finetune.model import full

    models = [tiny_model("llama", seed=0) for _ in range(2)]
    tuned = [full(m) for m in models]
    lean = train_mod.make_optimizer(tuned[0], CFG)
    plain = bitsandbytes.optim.AdamW8bit(tuned[1].param_groups(0.0), lr=CFG.lr, betas=CFG.adam_betas,
                                         eps=CFG.adam_eps)
    order = [p for g in lean.param_groups for p in g["params"]]
    largest = order[-1]
    assert largest.numel() == max(q.numel() for q in order) > order[0].numel()
    assert len(order) == len(list(tuned[0].named_trainable()))

    grads_left_at_largest = []
    real = type(lean).__mro__[1].update_step  # bitsandbytes' own, under the subclass

    def spy(self, group, p, gindex, pindex):
        if p is largest:
            grads_left_at_largest.append(sum(q.grad is not None for q in order if q is not p))
        return real(self, group, p, gindex, pindex)

    for step in range(2):
        for g in range(2):
            torch.manual_seed(step)
            for q in models[g].hf.parameters():
                q.grad = torch.randn_like(q)
        type(lean).__mro__[1].update_step = spy
        try:
            lean.step()
        finally:
            type(lean).__mro__[1].update_step = real
        plain.step()
        assert all(q.grad is None for q in order)
        plain.zero_grad(set_to_none=True)
    assert grads_left_at_largest == [0, 0]
    a, b = weights(models[0]), weights(models[1])
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert any(not torch.equal(a[n], w) for n, w in weights(tiny_model("llama", seed=0)).items())

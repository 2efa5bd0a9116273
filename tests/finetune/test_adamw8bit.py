"""--optimizer adamw8bit: bitsandbytes' AdamW with 8-bit moments, for full SFT where fp32 AdamW does not fit.
Its moments of large tensors are uint8, its first step is AdamW's within the quantisation error, and a killed
run resumes bit-identical (the 8-bit states and their scales go through the checkpoint)."""
import pytest
import torch

import keyheads.finetune.train as train_mod
from keyheads.finetune.config import FinetuneConfig
from keyheads.finetune.run import finetune
from keyheads.testing import tiny_model

from tests.helpers import Killed, kill_at_optimizer_step

pytest.importorskip("bitsandbytes")
CFG = FinetuneConfig(method="full", optimizer="adamw8bit", max_steps=4, save_every=2, batch_size=8,
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
        cfg = FinetuneConfig(**{**CFG.to_json(), "optimizer": name, "max_steps": 1, "save_every": 0})
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
    assert info["train"]["steps_this_run"] == 2
    a, b = weights(resumed), weights(whole)
    assert all(torch.equal(a[n], b[n]) for n in a)

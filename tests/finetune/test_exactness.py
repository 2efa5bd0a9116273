"""Precise SFT equals training full copies of W_Q/W_K/W_V/W_O (and the MLPs) with gradients and
updates masked to the same slices, on every family."""
import copy
import math

import pytest
import torch

from keyheads.components import Components
from keyheads.finetune.data import collate, n_loss_tokens, tokenize
from keyheads.finetune.model import precise, slice_plan
from keyheads.finetune.settings import FinetuneSettings
from keyheads.finetune.train import batch_indices, completion_loss_sum, train
from keyheads.testing import TINY_FAMILIES, tiny_model

pytestmark = pytest.mark.slow  # precise against masked full training on every family, about 2 minutes

# Two heads in layer 1 (sharing a K/V group where there are groups), one in layer 2, and MLP 2.
COMPONENTS = Components(((1, 0), (1, 1), (2, 3)), (2,))


def _masks(model, components, kv):
    """Parameter name -> 0/1 mask of the entries precise SFT trains, from the slice plan."""
    params = dict(model.hf.named_parameters())
    prefix = model.family.layers
    masks = {}
    for (layer, path, kind), index in slice_plan(model, components, kv).items():
        module = model.layer_module(layer, path)
        conv = model.family.conv1d
        w = masks.setdefault(f"{prefix}.{layer}.{path}.weight", torch.zeros_like(module.weight))
        index = torch.tensor(index)
        rows = (kind == "rows") != conv  # Conv1D stores [in, out]
        if rows:
            w[index] = 1
        else:
            w[:, index] = 1
        if kind == "rows" and module.bias is not None:
            masks.setdefault(f"{prefix}.{layer}.{path}.bias", torch.zeros_like(module.bias))[index] = 1
    for layer in components.mlps:
        for name, p in model.layer_module(layer, model.family.mlp).named_parameters():
            masks[f"{prefix}.{layer}.{model.family.mlp}.{name}"] = torch.ones_like(p)
    assert set(masks) <= set(params)
    return masks


def _layer_of(name, prefix):
    return int(name[len(prefix) + 1:].split(".")[0])


def reference_train(model, data, cfg, components):
    """Full matrices trained with masked gradients; untrained entries restored after each step."""
    masks = _masks(model, components, cfg.kv)
    params = dict(model.hf.named_parameters())
    model.hf.requires_grad_(False)
    trained = {n: params[n] for n in masks}
    for p in trained.values():
        p.requires_grad_(True)
    start = {n: p.detach().clone() for n, p in trained.items()}
    decay = [p for p in trained.values() if p.ndim >= 2]
    rest = [p for p in trained.values() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=cfg.adam_betas,
        eps=cfg.adam_eps,
    )
    from transformers import get_linear_schedule_with_warmup

    steps = cfg.max_steps
    sched = get_linear_schedule_with_warmup(opt, math.ceil(cfg.warmup_ratio * steps), steps)
    per_layer = {l: len(h) for l, h in components.heads_by_layer().items()}
    mlp_names = {n for n in masks if f".{model.family.mlp}." in n}
    prefix = model.family.layers
    for step in range(steps):
        batch = [data[i] for i in batch_indices(step, len(data), cfg.optimizer_batch_size, cfg.seed)]
        tokens = n_loss_tokens(batch)
        for i in range(0, len(batch), cfg.micro_batch_size):
            inputs = collate(batch[i:i + cfg.micro_batch_size], model.tokenizer.pad_token_id, "cpu")
            labels = inputs.pop("labels")
            (completion_loss_sum(model.hf(**inputs, use_cache=False).logits, labels) / tokens).backward()
        for n, p in trained.items():
            p.grad.mul_(masks[n])
            if cfg.rescale and n not in mlp_names:
                p.grad.mul_(model.n_heads / per_layer[_layer_of(n, prefix)])
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(list(trained.values()), cfg.max_grad_norm)
        opt.step()
        sched.step()
        opt.zero_grad()
        with torch.no_grad():
            for n, p in trained.items():
                p.copy_(torch.where(masks[n].bool(), p, start[n]))
    model.hf.requires_grad_(False)
    return masks, start


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("kv", ["group", "none"])
def test_precise_equals_masked_full_training(family, kv, examples, tmp_path):
    cfg = FinetuneSettings(lr=3e-3, optimizer_batch_size=8, micro_batch_size=3, max_steps=6, warmup_ratio=0.2,
                         weight_decay=0.1, max_grad_norm=0.5, kv=kv, save_every=0)
    ours = tiny_model(family, seed=1, dtype=torch.float64)  # so that 1e-6 measures the method, not rounding
    ref = copy.deepcopy(ours)
    data = tokenize(ours.tokenizer, examples, cfg.max_length)
    tuned = precise(ours, COMPONENTS, kv)
    train(tuned, data, cfg, tmp_path, {}, progress=False)
    masks, start = reference_train(ref, data, cfg, COMPONENTS)

    # Same function: logits agree.
    inputs = collate(data[:6], ours.tokenizer.pad_token_id, "cpu")
    inputs.pop("labels")
    with torch.no_grad():
        a = ours.hf(**inputs).logits
        b = ref.hf(**inputs).logits
    assert (a - b).abs().max().item() < 1e-6
    # Same weights: W0 + delta equals the reference's trained matrices, and training moved them.
    from keyheads.finetune.adapter import merge_adapter

    merge_adapter(tuned)
    params_ref = dict(ref.hf.named_parameters())
    moved = 0.0
    for name, p in ours.hf.named_parameters():
        assert (p - params_ref[name]).abs().max().item() < 1e-6, name
        if name in masks:
            moved = max(moved, (p - start[name]).abs().max().item())
        else:
            assert torch.equal(p, params_ref[name]), f"{name} changed but is not trained"
    assert moved > 1e-3


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_trained_parameter_count(family):
    """Q and O blocks per head, K and V blocks per group touched, biases where the family has them."""
    model = tiny_model(family)
    c = Components(((1, 0), (1, 1), (2, 3)), ())
    d, hd = model.d_model, model.head_dim
    has_qkv_bias = family in ("qwen2", "gpt2", "gpt_neox", "gpt_neox_serial")
    groups = {(l, model.family.kv_head_of(model.config, h)) for l, h in c.heads}
    per_block = hd * d + (hd if has_qkv_bias else 0)
    expected_group = 3 * (per_block + d * hd) + 2 * len(groups) * per_block
    expected_none = 3 * (per_block + d * hd)
    assert precise(tiny_model(family), c, "group").n_trainable == expected_group
    assert precise(tiny_model(family), c, "none").n_trainable == expected_none

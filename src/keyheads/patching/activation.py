"""Activation patching at END (total effect): the sender gets its counterfactual value and
everything above it recomputes, heads included.

END is the last position, so a change there cannot reach any other position: only END
needs recomputing. The reference prefix is run once into a key/value cache, and each
sender costs one single-token forward pass on top of it.
"""
from __future__ import annotations

import copy

import torch

from ..models.model import HookedModel
from .common import BatchResult, forward_end, logits_quantity
from .samples import Batch


def _end_step(model: HookedModel, batch: Batch, cache, edit: dict) -> torch.Tensor:
    prefix_len = batch.ref.shape[1] - 1
    inputs = batch.inputs()
    if inputs:  # the step's mask covers the cached prefix too; END's position differs by row
        step = {"attention_mask": inputs["attention_mask"], "position_ids": inputs["position_ids"][:, -1:]}
    else:
        step = {"position_ids": torch.full_like(batch.ref[:, -1:], prefix_len)}
    # a fresh copy per sender: the step appends END's keys/values to the cache it is given,
    # and cropping differs between cache types (sliding-window layers) and library versions
    with model.hooks(edit=edit):
        out = model.hf(input_ids=batch.ref[:, -1:], past_key_values=copy.deepcopy(cache), use_cache=True,
                       cache_position=torch.tensor([prefix_len], device=batch.ref.device), **step)
    return out.logits[:, -1]


@torch.no_grad()
def activation_patch_batch(model: HookedModel, batch: Batch, metric: str) -> BatchResult:
    L, H = model.n_layers, model.n_heads
    inputs = batch.inputs()
    _, c = forward_end(model, batch.cf, [f"{l}.head_out" for l in range(L)] + [f"{l}.mlp_write" for l in range(L)],
                       inputs=inputs, logits=False)
    logits, _ = forward_end(model, batch.ref, inputs=inputs)
    original = logits_quantity(metric, logits, batch.answer)
    prefix = {k: v[:, :-1] for k, v in inputs.items()}
    cache = model.hf(input_ids=batch.ref[:, :-1], use_cache=True, **prefix).past_key_values

    heads = original.new_zeros(len(original), L, H)
    mlps = original.new_zeros(len(original), L)
    for l in range(L):
        for h in range(H):
            def edit(z, l=l, h=h):
                z = z.clone()
                z[:, -1, h] = c[f"{l}.head_out"][:, h]
                return z
            logits = _end_step(model, batch, cache, {f"{l}.head_out": edit})
            heads[:, l, h] = logits_quantity(metric, logits, batch.answer)
        logits = _end_step(model, batch, cache,
                           {f"{l}.mlp_write": lambda x, l=l: c[f"{l}.mlp_write"][:, None].clone()})
        mlps[:, l] = logits_quantity(metric, logits, batch.answer)
    return BatchResult(original, heads, mlps)

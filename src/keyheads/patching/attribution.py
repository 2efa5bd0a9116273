"""Attribution patching: a first-order estimate of path patching from one forward and one
backward pass for all components at once; and its integrated-gradients variant (EAP-IG's idea, at node level),
which averages the gradient over inputs between the counterfactual and the reference.

Every head's output is made a leaf of the graph (detached), which freezes the heads as
path patching does: the gradient reaches a head only through the residual stream and the
MLPs above it. The estimate for a sender is grad . (counterfactual - reference) at END.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..models.model import HookedModel
from .common import BatchResult, forward_end, logits_quantity
from .samples import Batch


@contextmanager
def _frozen_parameters(model: HookedModel):
    flags = [(p, p.requires_grad) for p in model.hf.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def _end_gradients(model: HookedModel, batch: Batch, metric: str, embeds: torch.Tensor | None = None):
    """One forward and backward pass on the reference prompts (or on `embeds`, input embeddings in their place):
    (the metric's quantity [B], {point: its value at END}, {point: the quantity's gradient there}) for every layer's
    head outputs and MLP writes."""
    L = model.n_layers
    leaves: dict[str, torch.Tensor] = {}
    mlp_out: dict[str, torch.Tensor] = {}

    def make_leaf(z, key):
        leaf = z.detach().requires_grad_(True)
        leaves[key] = leaf
        return leaf

    def keep_mlp(x, key):
        if not x.requires_grad:  # nothing upstream needs a gradient (e.g. layer 0 of a parallel block)
            x = x.detach().requires_grad_(True)
        x.retain_grad()
        mlp_out[key] = x
        return x

    edits = {f"{l}.head_out": (lambda z, k=f"{l}.head_out": make_leaf(z, k)) for l in range(L)}
    edits.update({f"{l}.mlp_write": (lambda x, k=f"{l}.mlp_write": keep_mlp(x, k)) for l in range(L)})
    given = {"inputs_embeds": embeds} if embeds is not None else {"input_ids": batch.ref}
    with _frozen_parameters(model), torch.enable_grad():
        with model.hooks(edit=edits):
            logits = model.hf(**given, use_cache=False, **batch.inputs()).logits[:, -1]
        q = logits_quantity(metric, logits, batch.answer)
        q.sum().backward()
    values = {**{k: v[:, -1].detach() for k, v in leaves.items()}, **{k: v[:, -1].detach() for k, v in mlp_out.items()}}
    grads = {**{k: v.grad[:, -1] for k, v in leaves.items()}, **{k: v.grad[:, -1] for k, v in mlp_out.items()}}
    return q.detach(), values, grads


def _estimate(model: HookedModel, original: torch.Tensor, grads: dict, ref: dict, cf: dict) -> BatchResult:
    """grad . (counterfactual - reference) at END for every head and MLP, as estimated patched quantities."""
    L = model.n_layers

    def term(key: str) -> torch.Tensor:  # each layer's terms are on its own device when the model is dispatched
        return (grads[key] * (cf[key] - ref[key])).sum(-1).to(original.device)

    heads = torch.stack([term(f"{l}.head_out") for l in range(L)], dim=1)
    mlps = torch.stack([term(f"{l}.mlp_write") for l in range(L)], dim=1)
    return BatchResult(original, original[:, None, None] + heads, original[:, None] + mlps)


def _counterfactual_end(model: HookedModel, batch: Batch) -> dict[str, torch.Tensor]:
    L = model.n_layers
    with torch.no_grad():
        _, c = forward_end(model, batch.cf, [f"{l}.head_out" for l in range(L)] + [f"{l}.mlp_write" for l in range(L)],
                           inputs=batch.inputs(), logits=False)
    return c


def attribution_patch_batch(model: HookedModel, batch: Batch, metric: str) -> BatchResult:
    cf = _counterfactual_end(model, batch)
    original, ref, grads = _end_gradients(model, batch, metric)
    return _estimate(model, original, grads, ref, cf)


IG_STEPS = 5  # EAP-IG's default number of interpolation steps


def integrated_patch_batch(model: HookedModel, batch: Batch, metric: str, steps: int = IG_STEPS) -> BatchResult:
    """Attribution patching with integrated gradients (EAP-IG's idea, at node level): the gradient is the mean of
    the gradients at `steps` inputs whose embeddings lie evenly on the line from the counterfactual prompt's to the
    reference prompt's (k/steps of the way, k = 1..steps; the last is the reference itself), times the same
    difference of END values."""
    cf = _counterfactual_end(model, batch)
    embed = model.hf.get_input_embeddings()
    with torch.no_grad():
        e_ref, e_cf = embed(batch.ref), embed(batch.cf)
    total: dict[str, torch.Tensor] = {}
    for k in range(1, steps + 1):
        original, ref, grads = _end_gradients(model, batch, metric, e_cf + (k / steps) * (e_ref - e_cf))
        for key, g in grads.items():
            total[key] = total[key] + g if key in total else g
    mean = {key: g / steps for key, g in total.items()}
    return _estimate(model, original, mean, ref, cf)  # the last step is the reference: its quantity and values

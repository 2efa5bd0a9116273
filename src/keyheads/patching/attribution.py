"""Attribution patching: a first-order estimate of path patching from one forward and one
backward pass for all components at once.

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


def attribution_patch_batch(model: HookedModel, batch: Batch, metric: str) -> BatchResult:
    L = model.n_layers
    with torch.no_grad():
        _, c = forward_end(model, batch.cf, [f"{l}.head_out" for l in range(L)] + [f"{l}.mlp_write" for l in range(L)],
                           inputs=batch.inputs(), logits=False)
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
    with _frozen_parameters(model), torch.enable_grad():
        with model.hooks(edit=edits):
            logits = model.hf(input_ids=batch.ref, use_cache=False, **batch.inputs()).logits[:, -1]
        q = logits_quantity(metric, logits, batch.answer)
        q.sum().backward()
    original = q.detach()
    # each layer's terms are on its own device when the model is dispatched over several
    heads = torch.stack(
        [
            (
                (leaves[f"{l}.head_out"].grad[:, -1]) * (c[f"{l}.head_out"] - leaves[f"{l}.head_out"][:, -1].detach())
            ).sum(-1).to(original.device)
            for l in range(L)
        ],
        dim=1,
    )
    mlps = torch.stack(
        [
            (
                mlp_out[f"{l}.mlp_write"].grad[:, -1]
                * (c[f"{l}.mlp_write"] - mlp_out[f"{l}.mlp_write"][:, -1].detach())
            ).sum(-1).to(original.device)
            for l in range(L)
        ],
        dim=1,
    )
    # report as estimated patched quantities, like the exact methods
    return BatchResult(original, original[:, None, None] + heads, original[:, None] + mlps)

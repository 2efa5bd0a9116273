"""Path patching the obvious way: one full forward pass per sender, every other head frozen
by hooks. Slow (layers x heads forward passes); kept as the reference the fast method is
tested and benchmarked against."""
from __future__ import annotations

import torch

from ..models.model import HookedModel
from .common import BatchResult, forward_end, logits_quantity
from .samples import Batch


@torch.no_grad()
def naive_path_patch_batch(model: HookedModel, batch: Batch, metric: str, layers=None) -> BatchResult:
    """`layers` restricts the senders to those layers (the others are NaN): for spot checks."""
    L, H = model.n_layers, model.n_heads
    heads_pts = [f"{l}.head_out" for l in range(L)]
    inputs = batch.inputs()
    _, ref = model.run(batch.ref, capture=heads_pts, **inputs)
    _, cf = model.run(batch.cf, capture=heads_pts + [f"{l}.mlp_write" for l in range(L)], **inputs)
    logits, _ = forward_end(model, batch.ref, inputs=inputs)
    original = logits_quantity(metric, logits, batch.answer)

    def frozen(sender=None):
        """Edits that freeze every head at its reference value; `sender` (layer, head) gets
        its counterfactual value at END."""
        edits = {}
        for l in range(L):
            def edit(z, l=l):
                z = ref[f"{l}.head_out"].clone()
                if sender is not None and sender[0] == l:
                    z[:, -1, sender[1]] = cf[f"{l}.head_out"][:, -1, sender[1]]
                return z
            edits[f"{l}.head_out"] = edit
        return edits

    heads = original.new_full((len(original), L, H), float("nan"))
    mlps = original.new_full((len(original), L), float("nan"))
    for l in range(L) if layers is None else layers:
        for h in range(H):
            logits, _ = forward_end(model, batch.ref, edit=frozen((l, h)), inputs=inputs)
            heads[:, l, h] = logits_quantity(metric, logits, batch.answer)
        edits = frozen()

        def mlp_edit(x, l=l):
            x = x.clone()
            x[:, -1] = cf[f"{l}.mlp_write"][:, -1]
            return x

        edits[f"{l}.mlp_write"] = mlp_edit
        logits, _ = forward_end(model, batch.ref, edit=edits, inputs=inputs)
        mlps[:, l] = logits_quantity(metric, logits, batch.answer)
    return BatchResult(original, heads, mlps)

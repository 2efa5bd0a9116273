"""Exact path patching (sender -> logits) for every head and MLP, fast by construction.

Patching a sender at END with every head frozen at its reference value changes only
END's residual stream, and only through the MLPs above the sender: attention outputs
are frozen, and MLPs, norms and the unembedding act position by position. So instead
of one full forward pass per head we take two capturing passes (reference and
counterfactual) and then push one residual vector per (sender, sample) through the
MLPs above the sender. Senders of all layers travel together in one growing batch.
"""
from __future__ import annotations

import torch

from ..models.model import HookedModel
from .common import BatchResult, check_finite, end_quantity, forward_end, logits_quantity
from .samples import Batch


def _points(model: HookedModel) -> tuple[list[str], list[str]]:
    ref, cf = [], []
    for layer in range(model.n_layers):
        ref += [f"{layer}.head_out", f"{layer}.attn_out", f"{layer}.attn_write", f"{layer}.mlp_write",
                f"{layer}.resid_pre"]
        if not model.parallel_residual:
            ref.append(f"{layer}.resid_mid")
        cf += [f"{layer}.head_out", f"{layer}.mlp_write"]
    ref.append(f"{model.n_layers - 1}.resid_post")
    return ref, cf


def _first_bad(r: dict, n_layers: int) -> str:
    for layer in range(n_layers):
        for part in ("attn_write", "mlp_write"):
            if not torch.isfinite(r[f"{layer}.{part}"]).all():
                return f"layer {layer} ({part.split('_')[0]})"
    return "the final norm or unembedding"


def _mlp(model: HookedModel, layer: int, x: torch.Tensor, chunk: int) -> torch.Tensor:
    if x.shape[0] <= chunk:
        return model.mlp_write(layer, x)
    return torch.cat([model.mlp_write(layer, x[i:i + chunk]) for i in range(0, x.shape[0], chunk)])


@torch.no_grad()
def path_patch_batch(model: HookedModel, batch: Batch, metric: str, mlp_chunk: int = 4096) -> BatchResult:
    ref_points, cf_points = _points(model)
    logits, r = forward_end(model, batch.ref, ref_points)
    _, c = forward_end(model, batch.cf, cf_points)
    if not torch.isfinite(logits).all():
        raise FloatingPointError(f"non-finite logits on the reference prompts, first at {_first_bad(r, model.n_layers)}; "
                                 "try float32 (--dtype float32)")
    original = logits_quantity(metric, logits, batch.answer)
    B, H, L = batch.ref.shape[0], model.n_heads, model.n_layers
    samples = torch.arange(B, device=logits.device)

    x = logits.new_zeros(0, model.d_model)     # resid_pre at the current layer, one row per active sender
    owner = samples.new_zeros(0)               # which sample each row belongs to
    for layer in range(L):
        a = r[f"{layer}.attn_write"]
        # new head senders: their own contribution swapped for the counterfactual one
        delta = model.out_proj_heads(layer, c[f"{layer}.head_out"] - r[f"{layer}.head_out"])  # [B, H, d]
        if model.family.post_attn_norm is not None:
            new_write = model.attn_write_from_out(layer, r[f"{layer}.attn_out"][:, None] + delta)
        else:
            new_write = a[:, None] + delta
        dw = (new_write - a[:, None]).reshape(B * H, -1)       # row b*H + h
        head_owner = samples.repeat_interleave(H)
        if model.parallel_residual:
            moved = x + a[owner] + _mlp(model, layer, x, mlp_chunk)
            heads_post = r[f"{layer}.resid_pre"][head_owner] + a[head_owner] + r[f"{layer}.mlp_write"][head_owner] + dw
            mlp_post = r[f"{layer}.resid_pre"] + a + c[f"{layer}.mlp_write"]
            x = torch.cat([moved, heads_post, mlp_post])
        else:
            mid = torch.cat([x + a[owner], r[f"{layer}.resid_mid"][head_owner] + dw])
            post = mid + _mlp(model, layer, mid, mlp_chunk)
            mlp_post = r[f"{layer}.resid_mid"] + c[f"{layer}.mlp_write"]
            x = torch.cat([post, mlp_post])
        owner = torch.cat([owner, head_owner, samples])
        check_finite(x, f"layer {layer} of the path-patching sweep")

    q = end_quantity(model, metric, x, batch.answer[owner])
    # rows were appended layer by layer as [H*B head rows (b-major), B mlp rows]
    q = q.reshape(L, (H + 1) * B)
    heads = q[:, : H * B].reshape(L, B, H).permute(1, 0, 2)
    mlps = q[:, H * B:].T
    return BatchResult(original, heads, mlps)

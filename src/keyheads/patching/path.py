"""Exact path patching (sender -> logits) for every head and MLP, fast by construction.

Patching a sender at END with every head frozen at its reference value changes only
END's residual stream, and only through the MLPs above the sender: attention outputs
are frozen, and MLPs, norms and the unembedding act position by position. So instead
of one full forward pass per head we take two capturing passes (reference and
counterfactual) and then push one residual vector per (sender, sample) through the
MLPs above the sender. Senders of all layers travel together in one growing batch.

Left padding keeps END the last position of every row, so only the capturing passes
need the attention mask.
"""
from __future__ import annotations

import torch

from ..models.model import HookedModel
from .common import BatchResult, check_finite, end_quantity, forward_end, keep_freed_memory
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


def _add_mlp(model: HookedModel, layer: int, x: torch.Tensor, chunk: int) -> None:
    """x += the MLP's write for x, in place, in parts of at most `chunk` rows.

    Parts small enough for the MLP's hidden activations to stay in cache make its
    elementwise work (norm, activation, gating) cheap next to its matrix products; equal
    parts avoid a small last one, whose matrix products would run far below peak.
    """
    rows = x.view(-1, x.shape[-1])
    for part in rows.tensor_split(max(1, -(-rows.shape[0] // chunk))):
        part += model.mlp_write(layer, part)


def _capture(model: HookedModel, batch: Batch) -> tuple[dict, dict]:
    """END values of the reference (r) and counterfactual (c) prompts.

    Both halves travel in one pass: twice the rows per matrix product run closer to the
    machine's peak rate than two passes of half the size. Neither needs the vocabulary.
    Rows of very different lengths take separate passes, so that short rows are not
    padded to the longest (the sweep after it still takes the whole batch at once).
    """
    ref_points, cf_points = _points(model)
    r: dict[str, list] = {k: [] for k in ref_points}
    c: dict[str, list] = {k: [] for k in cf_points}
    for part in batch.by_length():
        B = part.ref.shape[0]
        inputs = {k: torch.cat([v, v]) for k, v in part.inputs().items()}
        _, both = forward_end(model, torch.cat([part.ref, part.cf]), ref_points, inputs=inputs, logits=False)
        for k in ref_points:
            r[k].append(both[k][:B])
        for k in cf_points:
            c[k].append(both[k][B:])
    # the sweep works on one device: a dispatched model's layers may sit on several
    dev = model.device
    return ({k: torch.cat(v).to(dev) for k, v in r.items()}, {k: torch.cat(v).to(dev) for k, v in c.items()})


def _sweep(model: HookedModel, r: dict, c: dict, mlp_chunk: int) -> torch.Tensor:
    """Final residuals at END of every patched run: [L, H + 1, B, d], heads then the MLP per layer.

    Row groups of B samples, one per sender, are laid out so that the senders alive at a
    layer are a prefix of the buffer and per-sample terms broadcast over groups.
    """
    H, L = model.n_heads, model.n_layers
    a0 = r["0.attn_write"]
    x = a0.new_empty(L * (H + 1), *a0.shape)
    for layer in range(L):
        g = layer * (H + 1)
        old, a = x[:g], r[f"{layer}.attn_write"]
        # new head senders: their own contribution swapped for the counterfactual one
        delta = model.out_proj_heads(layer, c[f"{layer}.head_out"] - r[f"{layer}.head_out"])  # [B, H, d]
        if model.family.post_attn_norm is not None:
            dw = model.attn_write_from_out(layer, r[f"{layer}.attn_out"][:, None] + delta) - a[:, None]
        else:
            dw = delta
        dw = dw.transpose(0, 1)                                                               # [H, B, d]
        if model.parallel_residual:
            _add_mlp(model, layer, old, mlp_chunk)
            old += a
            post = r[f"{layer}.resid_pre"] + a
            torch.add((post + r[f"{layer}.mlp_write"])[None], dw, out=x[g:g + H])
            torch.add(post, c[f"{layer}.mlp_write"], out=x[g + H])
        else:
            mid = r[f"{layer}.resid_mid"]
            old += a
            torch.add(mid[None], dw, out=x[g:g + H])
            _add_mlp(model, layer, x[:g + H], mlp_chunk)
            torch.add(mid, c[f"{layer}.mlp_write"], out=x[g + H])
        check_finite(x[:g + H + 1], f"layer {layer} of the path-patching sweep")
    return x.view(L, H + 1, *a0.shape)


@torch.no_grad()
def path_patch_batch(model: HookedModel, batch: Batch, metric: str, mlp_chunk: int = 1024) -> BatchResult:
    if model.device.type == "cpu":
        keep_freed_memory()
    r, c = _capture(model, batch)
    H, L = model.n_heads, model.n_layers
    # the original quantity comes from END's final residual, like every patched one
    original = end_quantity(model, metric, r[f"{L - 1}.resid_post"], batch.answer)
    if not torch.isfinite(original).all():
        raise FloatingPointError(f"non-finite logits on the reference prompts, first at {_first_bad(r, L)}; "
                                 "try float32 (--dtype float32)")
    x = _sweep(model, r, c, mlp_chunk)
    B = x.shape[2]
    q = end_quantity(model, metric, x.reshape(-1, model.d_model), batch.answer.repeat(L * (H + 1)))
    q = q.view(L, H + 1, B)
    return BatchResult(original, q[:, :H].permute(2, 0, 1), q[:, H].T)

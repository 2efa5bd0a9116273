"""Pieces shared by the patching methods: END-position captures and the answer quantity."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.model import HookedModel
from .metrics import quantity


@dataclass
class BatchResult:
    """Metric quantities for one batch: original [B], heads [B, L, H], mlps [B, L]."""

    original: torch.Tensor
    heads: torch.Tensor
    mlps: torch.Tensor


def forward_end(model: HookedModel, ids: torch.Tensor, capture: list[str] = (), edit: dict | None = None):
    """Forward pass on unpadded ids keeping only END: (logits [B, vocab], {point: value at END}).

    Capturing through an edit function that slices END keeps memory at [B, d] per point.
    """
    store: dict[str, torch.Tensor] = {}
    edits = dict(edit or {})
    for key in capture:
        inner = edits.get(key)

        def grab(x, key=key, inner=inner):
            if inner is not None:
                x = inner(x)
            store[key] = x[:, -1].detach()
            return x

        edits[key] = grab
    with model.hooks(edit=edits):
        try:
            out = model.hf(input_ids=ids, use_cache=False, logits_to_keep=1)
        except TypeError:  # older model classes without logits_to_keep
            out = model.hf(input_ids=ids, use_cache=False)
    return out.logits[:, -1], store


def end_quantity(model: HookedModel, metric: str, resid: torch.Tensor, answer: torch.Tensor,
                 chunk: int = 512) -> torch.Tensor:
    """The metric's quantity from final residual vectors [N, d] and answer ids [N].

    Only the answer rows of W_U are used, except for `prob`, which needs the softmax
    normaliser: it is computed in chunks so that memory stays at chunk x vocabulary.
    """
    out = []
    for start in range(0, resid.shape[0], chunk):
        x, a = resid[start:start + chunk], answer[start:start + chunk]
        logit = model.unembed(x, a)
        lse = model.unembed(x).logsumexp(-1) if metric == "prob" else None
        out.append(quantity(metric, logit, lse))
    return torch.cat(out)


def logits_quantity(metric: str, logits: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """The metric's quantity from full END logits [B, vocab]."""
    logit = logits.gather(-1, answer[:, None])[:, 0]
    return quantity(metric, logit, logits.logsumexp(-1) if metric == "prob" else None)


def check_finite(t: torch.Tensor, what: str) -> None:
    # one reduction instead of an elementwise test: NaN and inf survive a sum
    if not torch.isfinite(t.sum(dtype=torch.float32)):
        raise FloatingPointError(f"non-finite values (NaN or inf) in {what}; try float32 (--dtype float32)")

"""Pieces shared by the patching methods: END-position captures and the answer quantity."""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..models import hf_internals
from ..models.model import HookedModel
from .metrics import quantity


@dataclass
class BatchResult:
    """Metric quantities for one batch: original [B], heads [B, L, H], mlps [B, L]."""

    original: torch.Tensor
    heads: torch.Tensor
    mlps: torch.Tensor


def forward_end(model: HookedModel, ids: torch.Tensor, capture: Sequence[str] = (), edit: dict | None = None,
                inputs: dict | None = None, logits: bool = True):
    """Forward pass keeping only END: (logits [B, vocab] or None, {point: value at END}).

    `inputs` carries the attention mask and positions of a left-padded batch
    (Batch.inputs()). Capturing through an edit function that slices END keeps memory at
    [B, d] per point. With logits=False the unembedding is skipped: reading the whole of
    W_U for a few rows costs as much as a layer on small batches.
    """
    store: dict[str, torch.Tensor] = {}
    edits = dict(edit or {})
    for key in capture:
        inner = edits[key] if key in edits else None

        def grab(x, key=key, inner=inner):
            if inner is not None:
                x = inner(x)
            store[key] = x[:, -1].detach().clone()  # a view would keep all of x alive
            return x

        edits[key] = grab
    kwargs = dict(input_ids=ids, use_cache=False, **(inputs or {}))
    with model.hooks(edit=edits):
        if not logits and hf_internals.forward_body(model.hf, **kwargs):
            return None, store
        out = hf_internals.forward_last(model.hf, **kwargs)
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


@functools.cache
def keep_freed_memory() -> None:
    """Let the C allocator keep freed blocks for reuse instead of returning them at once.

    A forward pass frees and re-allocates activations of a few MB per layer. By default
    glibc hands the top of its heap back to the system and maps fresh pages for the next
    allocation, so every layer pays page faults: about a tenth of a path-patching batch of
    a small model on CPU (bench/patching.py). Afterwards the process holds on to its peak
    heap, as a caching allocator does; blocks above 32 MB (glibc's largest mmap
    threshold) are mapped and unmapped as before. Process-wide, set once; a no-op where
    the C library has no mallopt.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 1 << 30)

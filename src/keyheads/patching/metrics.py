"""How a change of the answer logit is scored."""
from __future__ import annotations

import torch


def score(metric: str, patched: torch.Tensor, original: torch.Tensor) -> torch.Tensor:
    """Per-sample effect from patched and original values of the metric's quantity.

    For relative-logit and logit-diff the quantity is the answer logit; for prob it is the
    answer probability. relative-logit is the paper's (logit_p - logit_o) / logit_o.
    """
    if metric == "relative-logit":
        return (patched - original) / original
    return patched - original


def quantity(metric: str, answer_logit: torch.Tensor, logsumexp: torch.Tensor | None) -> torch.Tensor:
    if metric == "prob":
        return torch.exp(answer_logit - logsumexp)
    return answer_logit


def valid_mask(metric: str, original_logit: torch.Tensor, min_abs_logit: float) -> torch.Tensor:
    """Samples whose original logit is too close to zero for a relative change are excluded."""
    if metric != "relative-logit":
        return torch.ones_like(original_logit, dtype=torch.bool)
    return original_logit.abs() >= min_abs_logit

"""Aggregating per-sample patching scores into Effects (the type lives in keyheads.effects)."""
from __future__ import annotations

import numpy as np
import torch

from ..effects import Effects
from ..errors import UserError
from .metrics import score, valid_mask


def aggregate(metric, method, model, data_sha256, original: np.ndarray, heads: np.ndarray,
              mlps: np.ndarray, min_abs_logit: float) -> Effects:
    o = torch.from_numpy(original)
    keep = valid_mask(metric, o, min_abs_logit).numpy()
    if not keep.any():
        raise UserError(f"every sample was excluded: |original answer logit| < {min_abs_logit} for all of them; "
                        "lower --min-abs-logit or use --metric logit-diff")
    s_heads = score(metric, torch.from_numpy(heads), o[:, None, None]).numpy()[keep]
    s_mlps = score(metric, torch.from_numpy(mlps), o[:, None]).numpy()[keep]
    n = int(keep.sum())

    def sem(x):
        return (x.std(0, ddof=1) / np.sqrt(n)) if n > 1 else np.zeros(x.shape[1:])

    return Effects(metric, method, model, n, int((~keep).sum()), data_sha256,
                   s_heads.mean(0).tolist(), s_mlps.mean(0).tolist(), sem(s_heads).tolist(), sem(s_mlps).tolist())

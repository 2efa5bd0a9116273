"""Reading effects.json (from `keyheads patch`) and choosing the key heads.

An effect is the relative change of the answer logit when a component is patched:
negative means the component matters. Heads are ranked most negative first.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..io import read_json
from ..knockout import Head
from .common import AnalysisError, fmt_heads

DEFAULT_THRESHOLD = -0.05  # the paper's "logit change exceeding -5%"


@dataclass
class Effects:
    """Per-head (and per-MLP) effects with the run's metadata.

    heads: [n_layers, n_heads] array; mlps: [n_layers] array or None; meta: the other fields
    of the file (metric, method, model, n_samples, ...); path: where it was read.
    """

    heads: np.ndarray
    mlps: np.ndarray | None
    meta: dict = field(default_factory=dict)
    path: str = ""

    @property
    def n_layers(self) -> int:
        return self.heads.shape[0]

    @property
    def n_heads(self) -> int:
        return self.heads.shape[1]

    def effect(self, head: Head) -> float:
        return float(self.heads[head[0], head[1]])

    def ranked(self) -> list[Head]:
        """All heads, most negative effect first; NaN effects (not measured) last; ties by position."""
        flat = [(l, h) for l in range(self.n_layers) for h in range(self.n_heads)]
        key = lambda lh: (math.isnan(self.effect(lh)), self.effect(lh) if not math.isnan(self.effect(lh)) else 0.0, lh)  # noqa: E731
        return sorted(flat, key=key)


def read_effects(path: str | Path, model=None) -> Effects:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (it is written by `keyheads patch`)")
    obj = read_json(path)
    if "heads" not in obj:
        raise AnalysisError(f"{path}: no 'heads' field (expected the effects.json written by `keyheads patch`)")
    try:
        heads = np.array(obj["heads"], dtype=float)
    except (TypeError, ValueError) as err:
        raise AnalysisError(f"{path}: 'heads' is not a [layer][head] table of numbers ({err})") from err
    if heads.ndim != 2:
        raise AnalysisError(f"{path}: 'heads' must be a list of per-layer lists, got shape {heads.shape}")
    mlps = np.array(obj["mlps"], dtype=float) if obj.get("mlps") is not None else None
    if model is not None and heads.shape != (model.n_layers, model.n_heads):
        raise AnalysisError(f"{path}: effects are for {heads.shape[0]} layers x {heads.shape[1]} heads but "
                            f"{model.name} has {model.n_layers} x {model.n_heads}; was it made with another model "
                            f"(its 'model' field says {obj.get('model')!r})?")
    meta = {k: v for k, v in obj.items() if k not in ("heads", "mlps")}
    return Effects(heads, mlps, meta, str(path))


def select_key_heads(effects: Effects, threshold: float | None = DEFAULT_THRESHOLD, top_k: int | None = None) -> list[Head]:
    """Key heads, most important first: the `top_k` most negative when given, else all below `threshold`."""
    ranked = [h for h in effects.ranked() if not math.isnan(effects.effect(h))]
    if top_k is not None:
        if top_k <= 0:
            raise AnalysisError(f"--top-k must be positive, got {top_k}")
        return ranked[:top_k]
    heads = [h for h in ranked if effects.effect(h) < threshold]
    if not heads:
        best = ranked[0] if ranked else None
        hint = f" (the most negative is {fmt_heads([best])} at {effects.effect(best):+.4f})" if best else ""
        raise AnalysisError(f"no head has an effect below the threshold {threshold:+g} in {effects.path}{hint}; "
                            "lower it with --threshold or choose the number of heads with --top-k")
    return heads

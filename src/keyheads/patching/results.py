"""Patching results: aggregation over samples, effects.json / CSV, and key heads."""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io import atomic_write_text, read_json, write_json
from .metrics import score, valid_mask

import torch

PAPER_THRESHOLD = -0.05  # the paper's key heads: "logit change exceeding -5%"


@dataclass
class Effects:
    """Mean effect of patching each head and MLP, over the samples that count.

    heads: [layers][heads] mean effects; mlps: [layers]; *_sem: standard errors.
    """

    metric: str
    method: str
    model: str
    n_samples: int
    n_excluded: int
    data_sha256: str
    heads: list[list[float]]
    mlps: list[float]
    heads_sem: list[list[float]]
    mlps_sem: list[float]

    @classmethod
    def aggregate(cls, metric, method, model, data_sha256, original: np.ndarray, heads: np.ndarray,
                  mlps: np.ndarray, min_abs_logit: float) -> "Effects":
        o = torch.from_numpy(original)
        keep = valid_mask(metric, o, min_abs_logit).numpy()
        if not keep.any():
            raise ValueError(f"every sample was excluded: |original answer logit| < {min_abs_logit} for all of them; "
                             "lower --min-abs-logit or use --metric logit-diff")
        s_heads = score(metric, torch.from_numpy(heads), o[:, None, None]).numpy()[keep]
        s_mlps = score(metric, torch.from_numpy(mlps), o[:, None]).numpy()[keep]
        n = int(keep.sum())

        def sem(x):
            return (x.std(0, ddof=1) / np.sqrt(n)) if n > 1 else np.zeros(x.shape[1:])

        return cls(metric, method, model, n, int((~keep).sum()), data_sha256,
                   s_heads.mean(0).tolist(), s_mlps.mean(0).tolist(), sem(s_heads).tolist(), sem(s_mlps).tolist())

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def load(cls, path, model=None) -> "Effects":
        """Read an effects.json; with `model`, check that its layers x heads match the model's."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist (it is written by `keyheads patch`)")
        data = read_json(path)
        for key in ("heads", "mlps", "metric"):
            if key not in data:
                raise ValueError(f"{path}: no {key!r} field (expected the effects.json written by `keyheads patch`)")
        shape = np.shape(data["heads"])
        if len(shape) != 2:
            raise ValueError(f"{path}: 'heads' must be a list of per-layer lists of numbers, got shape {shape}")
        if model is not None and shape != (model.n_layers, model.n_heads):
            raise ValueError(f"{path}: effects are for {shape[0]} layers x {shape[1]} heads but {model.name} has "
                             f"{model.n_layers} x {model.n_heads}; was it made with another model "
                             f"(its 'model' field says {data.get('model')!r})?")
        data.setdefault("heads_sem", [[0.0] * shape[1] for _ in range(shape[0])])
        data.setdefault("mlps_sem", [0.0] * len(data["mlps"]))
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})

    def effect(self, head: tuple[int, int]) -> float:
        return float(self.heads[head[0]][head[1]])

    def ranked(self) -> list[tuple[int, int]]:
        """Every (layer, head), most negative effect first; unmeasured (NaN) last; ties by position."""
        def key(lh):
            v = self.effect(lh)
            return (math.isnan(v), 0.0 if math.isnan(v) else v, lh)
        return sorted(((l, h) for l, row in enumerate(self.heads) for h in range(len(row))), key=key)

    def write(self, folder) -> None:
        write_json(folder / "effects.json", self.to_json())
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["component", "layer", "head", "label", "effect", "sem", "metric", "method"])
        for layer, row in enumerate(self.heads):
            for head, value in enumerate(row):
                w.writerow(["head", layer, head, f"{layer}.{head}", f"{value:.8g}",
                            f"{self.heads_sem[layer][head]:.8g}", self.metric, self.method])
        for layer, value in enumerate(self.mlps):
            w.writerow(["mlp", layer, "", f"mlp{layer}", f"{value:.8g}", f"{self.mlps_sem[layer]:.8g}",
                        self.metric, self.method])
        atomic_write_text(folder / "effects.csv", buf.getvalue())


def _below(effects: Effects, threshold: float | None, top_k: int | None) -> list[tuple[int, int]]:
    ranked = [h for h in effects.ranked() if not math.isnan(effects.effect(h))]
    return [h for h in ranked if threshold is None or effects.effect(h) < threshold][:top_k]


def select_heads(effects: Effects, threshold: float | None = PAPER_THRESHOLD,
                 top_k: int | None = None) -> list[tuple[int, int]]:
    """Key heads, most negative first: below `threshold` (None: no cut), at most `top_k`.

    Raises ValueError when nothing is selected, naming the threshold and the best head, since
    an empty list would make every later stage meaningless.
    """
    if top_k is not None and top_k <= 0:
        raise ValueError(f"--top-k must be positive, got {top_k}")
    chosen = _below(effects, threshold, top_k)
    if not chosen:
        ranked = _below(effects, None, 1)
        best = f" (the most negative is {ranked[0][0]}.{ranked[0][1]} at {effects.effect(ranked[0]):+.4f})" if ranked else ""
        raise ValueError(f"no head has an effect below the threshold {threshold:+g}{best}; "
                         "lower it with --threshold or choose the number of heads with --top-k")
    return chosen


def key_heads(effects: Effects, threshold: float | None = PAPER_THRESHOLD, top_k: int | None = None) -> dict:
    """The key_heads.json record: heads below `threshold` (the paper: -5%), or the `top_k` most
    negative; with both, the top-k among those below the threshold. May be empty (the record
    says which threshold gave nothing); `select_heads` is the strict version."""
    chosen = _below(effects, threshold, top_k)
    mlps = sorted((v, l) for l, v in enumerate(effects.mlps) if not math.isnan(v))
    mlps = [t for t in mlps if threshold is None or t[0] < threshold]
    return {
        "metric": effects.metric, "threshold": threshold, "top_k": top_k,
        "n_heads_total": sum(len(r) for r in effects.heads),
        "heads": [{"layer": l, "head": h, "label": f"{l}.{h}", "effect": effects.effect((l, h))} for l, h in chosen],
        "mlps": [{"layer": l, "effect": v} for v, l in mlps],
    }

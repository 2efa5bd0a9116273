"""Patching results: aggregation over samples, effects.json / CSV, and key heads."""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass

import numpy as np

from ..io import atomic_write_text, read_json, write_json
from .metrics import score, valid_mask

import torch


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
    def load(cls, path) -> "Effects":
        data = read_json(path)
        for key in ("heads", "mlps", "metric"):
            if key not in data:
                raise ValueError(f"{path} is not an effects.json file: it has no {key!r}")
        data.setdefault("heads_sem", [[0.0] * len(data["heads"][0]) for _ in data["heads"]])
        data.setdefault("mlps_sem", [0.0] * len(data["mlps"]))
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})

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


def key_heads(effects: Effects, threshold: float | None = -0.05, top_k: int | None = None) -> dict:
    """Heads whose effect is below `threshold` (the paper: -5%), or the `top_k` most negative.

    With both, the top-k among those below the threshold.
    """
    flat = [(v, l, h) for l, row in enumerate(effects.heads) for h, v in enumerate(row)]
    flat.sort()
    chosen = [t for t in flat if threshold is None or t[0] < threshold]
    if top_k is not None:
        chosen = chosen[:top_k]
    mlps = sorted((v, l) for l, v in enumerate(effects.mlps))
    mlps = [t for t in mlps if threshold is None or t[0] < threshold]
    return {
        "metric": effects.metric, "threshold": threshold, "top_k": top_k,
        "n_heads_total": sum(len(r) for r in effects.heads),
        "heads": [{"layer": l, "head": h, "label": f"{l}.{h}", "effect": v} for v, l, h in chosen],
        "mlps": [{"layer": l, "effect": v} for v, l in mlps],
    }

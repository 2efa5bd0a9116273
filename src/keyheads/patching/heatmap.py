"""The paper's figure 2: effect per head (layers x heads) beside a column for the MLPs.

Red is a negative effect: patching the component lowers the answer, so it helps compute
it (the paper's colouring). Heads and MLPs get their own symmetric colour scales, since
MLP effects are often an order of magnitude larger and would wash the heads out.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..effects import Effects
from ..plotting import save_figure, subplots

UNITS = {"relative-logit": ("relative change of the answer logit", 100.0, "%"),
         "logit-diff": ("change of the answer logit", 1.0, ""),
         "prob": ("change of the answer probability", 1.0, "")}


def draw_heatmap(effects: Effects, path: Path, key: Sequence[tuple[int, int]] = (), title: str | None = None) -> Path:
    label, scale, unit = UNITS[effects.metric] if effects.metric in UNITS else (effects.metric, 1.0, "")  # another
    # tool's scores are drawn as given
    heads = np.asarray(effects.heads) * scale
    mlps = np.asarray(effects.mlps)[:, None] * scale
    L, H = heads.shape
    from matplotlib.colors import TwoSlopeNorm  # noqa: PLC0415 -- loaded on use, see pyproject

    fig, (ax, axm) = subplots(1, 2, figsize=(0.55 * H + 3.8, 0.3 * L + 1.6),
                                  gridspec_kw={"width_ratios": [H, 1], "wspace": 0.45})

    def panel(axis, values, name):
        lim = max(float(np.abs(values).max()), 1e-12)
        im = axis.imshow(values, cmap="RdBu", norm=TwoSlopeNorm(vmin=-lim, vcenter=0.0, vmax=lim), aspect="auto")
        bar = fig.colorbar(im, ax=axis, shrink=0.9, pad=0.04)
        bar.set_label(f"{name}: {label}{' (' + unit + ')' if unit else ''}", fontsize=8)
        bar.ax.tick_params(labelsize=7)
        return lim

    panel(ax, heads, "heads")
    mlim = panel(axm, mlps, "MLP")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(H))
    ax.set_yticks(range(L))
    ax.tick_params(labelsize=7)
    axm.set_xticks([0], ["MLP"])
    axm.set_yticks(range(L))
    axm.tick_params(labelsize=7)
    for l, h in key:
        ax.text(h, l, f"{l}.{h}", ha="center", va="center", fontsize=6, fontweight="bold")
    for l in range(L):
        if abs(mlps[l, 0]) >= 0.5 * mlim:
            axm.text(0, l, f"{mlps[l, 0]:.2g}", ha="center", va="center", fontsize=6)
    fig.suptitle(title or f"{effects.method} patching, {effects.model}, n={effects.n_samples}\n"
                 "red: patching lowers the answer, so the component helps compute it", fontsize=9)
    return save_figure(fig, path)

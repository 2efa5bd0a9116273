"""The paper's figure 2: effect per head (layers x heads) with an MLP column."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..io import atomic_write_bytes
from .results import Effects


def draw_heatmap(effects: Effects, path: Path, key: list[tuple[int, int]] = (), title: str | None = None) -> Path:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    heads = np.asarray(effects.heads)
    mlps = np.asarray(effects.mlps)[:, None]
    L, H = heads.shape
    scale = 100.0 if effects.metric == "relative-logit" else 1.0
    unit = "%" if scale == 100.0 else ""
    lim = max(np.abs(heads).max(), np.abs(mlps).max(), 1e-9) * scale
    norm = TwoSlopeNorm(vmin=-lim, vcenter=0.0, vmax=lim)
    fig, (ax, axm) = plt.subplots(1, 2, figsize=(max(4.0, 0.45 * H + 2.5), max(4.0, 0.28 * L + 1.8)),
                                  gridspec_kw={"width_ratios": [H, 1.2], "wspace": 0.08})
    im = ax.imshow(heads * scale, cmap="RdBu", norm=norm, aspect="auto", origin="upper")
    axm.imshow(mlps * scale, cmap="RdBu", norm=norm, aspect="auto", origin="upper")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(H))
    ax.set_yticks(range(L))
    ax.tick_params(labelsize=7)
    axm.set_xticks([0], ["MLP"])
    axm.set_yticks([])
    for l, h in key:
        ax.text(h, l, f"{l}.{h}", ha="center", va="center", fontsize=6, color="black", fontweight="bold")
    for l in range(L):
        if abs(mlps[l, 0]) * scale >= 0.5 * lim:
            axm.text(0, l, f"{mlps[l, 0] * scale:.0f}", ha="center", va="center", fontsize=6)
    label = {"relative-logit": "relative change of the answer logit (%)", "logit-diff": "change of the answer logit",
             "prob": "change of the answer probability"}[effects.metric]
    fig.colorbar(im, ax=[ax, axm], shrink=0.8, label=label)
    fig.suptitle(title or f"{effects.method} patching, {effects.model} (n={effects.n_samples}); "
                 f"blue: patching lowers the answer{unit and ''}", fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130, bbox_inches="tight")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())

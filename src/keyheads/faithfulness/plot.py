"""The faithfulness curve as a figure: f at each circuit size, with the whole model (1) and the empty circuit (0)."""
from __future__ import annotations

from pathlib import Path

from ..plotting import pyplot, save_figure
from .curve import Curve


def plot_curve(curve: Curve, path: str | Path, title: str = "") -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    x = [100 * p for p in curve.percentages]
    ax.plot(x, curve.f, marker="o", label=f"CPR {curve.cpr:.3f}, CMD {curve.cmd:.3f}")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.axhline(0.0, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    what = "edges" if curve.level == "edge" else "heads and MLPs"
    ax.set_xlabel(f"circuit size (% of {curve.n_scored} scored {what})")
    ax.set_ylabel("faithfulness f(C)")
    ax.set_title(title or f"{curve.ablation} ablation, answer {curve.metric}, {curve.n_items} pairs", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    try:
        return save_figure(fig, path)
    finally:
        plt.close(fig)

"""Figure 3: accuracy while the top-k heads are knocked out, in effect order against random order.

Mean ablation replaces a head's output by its mean over the counterfactual prompts. The
means of every candidate head are computed once; each point of a curve is then one
batched forward pass with the first k heads of an ordering replaced. "random-rank" is a
seeded random permutation of all heads, so point k knocks out k distinct heads and the
sets are nested in k, as for "effect-rank".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from ..knockout import Head, Knockout
from ..models.model import HookedModel
from .common import Batches, knockout_subset, predict


@dataclass
class CurveConfig:
    """k: the largest number of heads knocked out (the curves have k+1 points, 0..k);
    seeds: how many random orderings; seed: the first seed (seeds are seed, seed+1, ...)."""

    k: int = 20
    seeds: int = 5
    seed: int = 0


@dataclass
class Curves:
    ks: list[int]
    effect: list[float]                     # accuracy after knocking out effect-rank heads 1..k
    random: list[list[float]]               # [seed][k] accuracy for random-rank
    effect_order: list[Head]                # the first k heads of the effect ranking
    random_orders: list[list[Head]] = field(default_factory=list)

    @property
    def random_mean(self) -> np.ndarray:
        return np.mean(np.array(self.random), axis=0)

    @property
    def random_std(self) -> np.ndarray:
        return np.std(np.array(self.random), axis=0)


def random_order(heads: Sequence[Head], seed: int) -> list[Head]:
    rng = np.random.default_rng(seed)
    return [heads[i] for i in rng.permutation(len(heads))]


def accuracy_with(model: HookedModel, batches: Batches, answer_ids: Sequence[int], full: Knockout | None,
                  heads: Sequence[Head]) -> float:
    """Top-1 accuracy with `heads` mean-ablated (no edit at all for an empty list)."""
    edits = knockout_subset(full, heads).edits() if heads else None
    return predict(model, batches, answer_ids, edits).accuracy(answer_ids)


def knockout_curves(model: HookedModel, batches: Batches, answer_ids: Sequence[int], full: Knockout,
                    ranked: Sequence[Head], candidates: Sequence[Head], cfg: CurveConfig,
                    progress: bool = True) -> Curves:
    """Accuracy for k = 0..cfg.k heads knocked out, for `ranked` and for cfg.seeds random orders of `candidates`."""
    ks = list(range(cfg.k + 1))
    orders = [random_order(candidates, cfg.seed + s) for s in range(cfg.seeds)]
    bar = tqdm(total=cfg.k * (1 + cfg.seeds) + 1, desc="knockout curves", disable=not progress)
    base = accuracy_with(model, batches, answer_ids, full, [])
    bar.update()
    effect = [base]
    for k in ks[1:]:
        effect.append(accuracy_with(model, batches, answer_ids, full, ranked[:k]))
        bar.update()
    random = []
    for order in orders:
        row = [base]
        for k in ks[1:]:
            row.append(accuracy_with(model, batches, answer_ids, full, order[:k]))
            bar.update()
        random.append(row)
    bar.close()
    return Curves(ks, effect, random, list(ranked[:cfg.k]), [o[:cfg.k] for o in orders])


def plot_curves(curves: Curves, path, title: str) -> None:
    from ..report.figures import new_figure, save_figure

    fig, ax = new_figure(7.5, 4.2)
    ks = np.array(curves.ks)
    ax.plot(ks, curves.effect, "o-", color="tab:red", label="effect-rank (most negative effect first)")
    mean, std = curves.random_mean, curves.random_std
    lo, hi = np.min(curves.random, axis=0), np.max(curves.random, axis=0)
    ax.plot(ks, mean, "s-", color="tab:blue", label=f"random-rank (mean of {len(curves.random)} seeds)")
    ax.fill_between(ks, np.clip(mean - std, 0, 1), np.clip(mean + std, 0, 1), color="tab:blue", alpha=0.25,
                    label="random-rank ±1 std")
    ax.fill_between(ks, lo, hi, color="tab:blue", alpha=0.08, label="random-rank min–max")
    ax.set_xlabel("number of heads knocked out (k)")
    ax.set_ylabel("accuracy (top-1 = answer)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlim(0, ks[-1])
    ax.set_xticks(ks if len(ks) <= 26 else ks[::max(1, len(ks) // 20)])
    ax.grid(alpha=0.3)
    ax.set_title(title)
    # name the heads along the top axis so the effect order can be read off the plot
    if len(curves.effect_order) <= 30:
        top = ax.secondary_xaxis("top")
        top.set_xticks(ks[1:], [f"{l}.{h}" for l, h in curves.effect_order], rotation=90, fontsize=7)
        top.set_xlabel("head added at step k (effect-rank)", fontsize=8)
    ax.legend(loc="lower left", fontsize=8)
    save_figure(fig, path)

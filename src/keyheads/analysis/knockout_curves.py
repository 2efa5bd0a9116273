"""Figure 3: accuracy while the top-k heads are knocked out, in effect order against random order.

Mean ablation replaces a head's output by its mean over the counterfactual prompts. The
means of every candidate head are computed once; each point of a curve knocks out the first
k heads of an ordering, and all points are computed together by the passes of passes.py
(shared prefixes, clean lower layers, END-only logits, several sets per pass). "random-rank" is a
seeded random permutation of all heads, so point k knocks out k distinct heads and the
sets are nested in k, as for "effect-rank".
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..distributed import map_sharded
from ..heads import Head
from ..knockout import Knockout
from ..models.model import HookedModel
from ..models.prompt_set import PromptSet
from ..plotting import new_figure, save_figure
from .passes import EndPasses
from .resumable import resumable_map

CHUNK = 32  # knockout sets per checkpointed chunk: a few passes of the batched engine


@dataclass
class CurveSettings:
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
    extra: list[float] = field(default_factory=list)  # accuracies of the caller's `extra` sets

    @property
    def random_mean(self) -> np.ndarray:
        return np.mean(np.array(self.random), axis=0)

    @property
    def random_std(self) -> np.ndarray:
        return np.std(np.array(self.random), axis=0)


def random_order(heads: Sequence[Head], seed: int) -> list[Head]:
    rng = np.random.default_rng(seed)
    return [heads[i] for i in rng.permutation(len(heads))]


def set_accuracies(model: HookedModel, prompts: PromptSet, answer_ids: Sequence[int], full: Knockout,
                   sets: Sequence[Sequence[Head]], progress: bool = False) -> list[float]:
    """Top-1 accuracy under each knockout set, all sets batched (see passes.py)."""
    engine = EndPasses(model, prompts, full)
    answers = torch.as_tensor(list(answer_ids))
    correct = [0] * len(sets)

    def count(i, index, logits):
        correct[i] += int((logits.argmax(-1) == answers[torch.tensor(index)]).sum())

    engine.logits(sets, count, progress=progress, desc="knockout curves")
    return [c / prompts.n if prompts.n else float("nan") for c in correct]


def curve_sets(ranked: Sequence[Head], candidates: Sequence[Head], cfg: CurveSettings) -> tuple[list, list]:
    """(sets, random orders): the empty set, effect-rank sets k = 1..K, then each seed's k = 1..K."""
    orders = [random_order(candidates, cfg.seed + s) for s in range(cfg.seeds)]
    sets: list[list[Head]] = [[]] + [list(ranked[:k]) for k in range(1, cfg.k + 1)]
    for order in orders:
        sets += [order[:k] for k in range(1, cfg.k + 1)]
    return sets, orders


def knockout_curves(model: HookedModel, prompts: PromptSet, answer_ids: Sequence[int], full: Knockout,
                    ranked: Sequence[Head], candidates: Sequence[Head], cfg: CurveSettings,
                    progress: bool = True, extra: Sequence[Sequence[Head]] = (),
                    checkpoint: tuple[Path, str] | None = None) -> Curves:
    """Accuracy for k = 0..cfg.k heads knocked out, for `ranked` and for cfg.seeds random orders of `candidates`,
    by the batched passes (set_accuracies). The accuracies of the `extra` sets come back in `Curves.extra`.

    With `checkpoint` (a file, and a key naming everything the accuracies depend on) the sets
    run in chunks, and the accuracies of every finished chunk are kept in the file: a run
    interrupted at 7B scale, hours in, continues where it stopped. A file with another key is
    ignored.
    """
    sets, orders = curve_sets(ranked, candidates, cfg)
    sets += [list(s) for s in extra]

    def compute(part):
        return set_accuracies(model, prompts, answer_ids, full, part, progress)

    return curves_from(_in_chunks(compute, sets, model.n_layers, checkpoint), ranked, orders, cfg, len(extra))


def curves_from(acc: list[float], ranked: Sequence[Head], orders: Sequence[Sequence[Head]], cfg: CurveSettings,
                n_extra: int = 0) -> Curves:
    """The curves from the accuracies of curve_sets' sets, in its order, then of `n_extra` extra sets."""
    K = cfg.k
    effect = acc[:K + 1]
    random = [[acc[0]] + acc[1 + K * (s + 1): 1 + K * (s + 2)] for s in range(cfg.seeds)]
    return Curves(list(range(K + 1)), effect, random, list(ranked[:K]), [list(o[:K]) for o in orders],
                  acc[len(acc) - n_extra:] if n_extra else [])


def _in_chunks(compute, sets: list, n_layers: int, checkpoint: tuple[Path, str] | None) -> list[float]:
    """compute(sets) over every process, in checkpointed chunks when asked (see knockout_curves)."""
    if checkpoint is None:
        return map_sharded(compute, sets)
    path, key = checkpoint
    # sets that start at the same layer share passes: chunks follow the passes' own order
    return resumable_map(compute, sets, path, key, CHUNK, decode=float,
                         order=lambda todo: sorted(todo, key=lambda i: -min((l for l, _ in sets[i]),
                                                                             default=n_layers)))


def plot_curves(curves: Curves, path, title: str) -> None:
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

"""key_heads.json: the heads identify chose, in rank order, with the rule that chose them.

The heads carry their label and effect for people reading the file; code reads `heads_ranked`. `KeyHeads.chosen`
applies the selection rule of keyheads.components to the effects; effects.json is `keyheads.effects.Effects`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..components import cut_of, rank_heads, rank_mlps
from ..effects import Effects
from ..heads import Head
from .base import Result


class KeyHead(Result):
    layer: int
    head: int
    label: str
    effect: float


class KeyMLP(Result):
    """An MLP layer below the threshold (ranked, as the heads are); precise SFT's +mlp variants take the first."""

    layer: int
    effect: float


class KeyHeads(Result):
    metric: str
    threshold: float | None
    top_k: int | None
    n_heads_total: int
    heads: list[KeyHead]
    mlps: list[KeyMLP]
    seconds: float | None = None  # the stage's time, saved here by releases before the stage records

    @classmethod
    def chosen(cls, effects: Effects, threshold: float | None = None, top_k: int | None = None) -> KeyHeads:
        """The key heads of `effects`: with neither `threshold` nor `top_k` the paper's -5% applies; with both,
        the top K of those below the threshold. It may be empty: it then records the threshold that gave
        nothing."""
        threshold = cut_of(threshold, top_k)
        return cls(metric=effects.metric, threshold=threshold, top_k=top_k,
                   n_heads_total=sum(len(r) for r in effects.heads),
                   heads=[KeyHead(layer=h.layer, head=h.head, label=str(h), effect=effects.effect(h))
                          for h in rank_heads(effects, threshold, top_k)],
                   mlps=[KeyMLP(layer=layer, effect=effects.mlps[layer]) for layer in rank_mlps(effects, threshold)])

    @property
    def heads_ranked(self) -> list[Head]:
        """The key heads as Heads, most negative effect first."""
        return [Head(k.layer, k.head) for k in self.heads]


@dataclass(frozen=True)
class Identification:
    """One identification's two files: identify/ (the run's pairs) or identify/NAME/ (also_identify)."""

    effects: Effects
    key_heads: KeyHeads

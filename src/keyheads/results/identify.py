"""key_heads.json: the heads identify chose, in rank order, with the rule that chose them.

The heads carry their label and effect for people reading the file; code reads `heads_ranked`. `KeyHeads.chosen`
applies the selection rule of keyheads.components to the effects; effects.json is `keyheads.effects.Effects`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ..components import cut_of, rank_heads, rank_mlps
from ..effects import Effects
from ..errors import BadFile, MissingFile
from ..heads import Head
from ..io import read_json
from .base import Result, problems


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

    @classmethod
    def read(cls, path: str | Path) -> KeyHeads:
        """A key_heads.json as identify wrote it; a missing or malformed file is an error that names it."""
        path = Path(path)
        if not path.is_file():
            raise MissingFile(f"{path} does not exist (`keyheads identify` and the identify stage write it)")
        try:
            return cls.from_json(read_json(path))
        except ValidationError as err:
            raise BadFile(f"{path} is not a key_heads.json written by keyheads ({problems(err)})") from None

    @property
    def heads_ranked(self) -> list[Head]:
        """The key heads as Heads, most negative effect first."""
        return [Head(k.layer, k.head) for k in self.heads]


@dataclass(frozen=True)
class Identification:
    """One identification: its two files, identify/ (the run's pairs) or identify/NAME/ (also_identify), and what
    the step that made them measured besides (None when read back from the files)."""

    effects: Effects
    key_heads: KeyHeads
    seconds: float | None = None  # the sweep's time (0 for effects read from a circuit file)
    spearman_vs_path: float | None = None  # attribution methods: rank correlation with exact path patching

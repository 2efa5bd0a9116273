"""Which heads and MLP layers a stage works on, and the one rule that chooses them from effects.

A `Components` is built in one of four ways, each a classmethod: from effects (`select`: the key
heads, the top K, the top MLPs), from the key_heads.json that identify wrote (`read_key_heads`), from
an explicit list (`explicit`), or as a seeded random draw (`random_heads`). It is checked against a
model once and travels between stages as data: {"heads": [{"layer", "head"}], "mlps": [...]}.
"""
from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field

from .effects import PAPER_THRESHOLD, Effects
from .errors import BadFile, MissingFile, UserError
from .heads import Head, heads_of, parse_layers, read_heads
from .io import read_json

__all__ = ["Components", "Threshold", "TopK", "rank_heads", "rank_mlps"]

# The rule's two settings, declared once: each settings type that takes them (`keyheads identify`, a run's
# `identify:` section, the analysis commands) says `threshold: Threshold = None` and `top_k: TopK = None`.
Threshold = Annotated[float | None, Field(
    description="key heads: effect below this (default -0.05, the paper's -5%, unless top_k is given)")]
TopK = Annotated[int | None, Field(
    ge=1, description="key heads: the K most negative (among those below threshold if that is given too)")]


def rank_heads(effects: Effects, threshold: float | None = None, top_k: int | None = None) -> list[Head]:
    """The selection rule: heads most negative first, below `threshold` (None: no cut), at most
    `top_k` (None: no limit); an unmeasured (NaN) head is never chosen."""
    ranked = [h for h in effects.ranked() if not math.isnan(effects.effect(h))]
    return [h for h in ranked if threshold is None or effects.effect(h) < threshold][:top_k]


def rank_mlps(effects: Effects, threshold: float | None = None) -> list[int]:
    """The MLP layers most negative first, below `threshold` (None: no cut); unmeasured (NaN) ones never."""
    ranked = sorted((v, layer) for layer, v in enumerate(effects.mlps) if not math.isnan(v))
    return [layer for v, layer in ranked if threshold is None or v < threshold]


def cut_of(threshold: float | None, top_k: int | None) -> float | None:
    """The threshold a choice uses: the paper's -5% when neither a threshold nor a count is given (the one
    place that default lives), else the threshold given (None: no cut)."""
    return PAPER_THRESHOLD if threshold is None and top_k is None else threshold


def rule_text(threshold: float | None, top_k: int | None) -> str:
    """How a key_heads.json record (keyheads.results.identify.KeyHeads) chose its heads, in words: "the top 32 by
    effect", "effect below -0.05", "the top 10 of those with effect below -0.05"."""
    if threshold is None and top_k is None:
        return "every head"
    if threshold is None:
        return f"the top {top_k} by effect"
    if top_k is None:
        return f"effect below {threshold:g}"
    return f"the top {top_k} of those with effect below {threshold:g}"


@dataclass(frozen=True)
class Components:
    """Attention heads and whole MLP layers.

    Attributes:
        heads: heads in selection order (most important first when ranked).
        mlps: MLP layers in selection order.
        source: how they were chosen, for reports ("top-32 heads of effects.json", "random 32 heads, seed 0").
    """

    heads: tuple[Head, ...] = ()
    mlps: tuple[int, ...] = ()
    source: str = "explicit"

    def __post_init__(self):
        object.__setattr__(self, "heads", tuple(Head(int(l), int(h)) for l, h in self.heads))
        object.__setattr__(self, "mlps", tuple(int(m) for m in self.mlps))
        if len(set(self.heads)) != len(self.heads):
            raise UserError(f"a head is listed twice in {', '.join(map(str, self.heads))}")
        if len(set(self.mlps)) != len(self.mlps):
            raise UserError(f"an MLP layer is listed twice in {list(self.mlps)}")

    def heads_by_layer(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for layer, head in sorted(self.heads):
            out.setdefault(layer, []).append(head)
        return out

    def check(self, n_layers: int, n_heads: int) -> Components:
        """Itself, if every head and MLP exists in a model of this shape."""
        for layer, head in self.heads:
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise UserError(f"head {layer}.{head} does not exist: the model has {n_layers} layers x {n_heads} "
                                f"heads (layers 0..{n_layers - 1}, heads 0..{n_heads - 1})")
        for layer in self.mlps:
            if not 0 <= layer < n_layers:
                raise UserError(f"MLP layer {layer} does not exist: the model has layers 0..{n_layers - 1}")
        return self

    def lowest_layer(self) -> int | None:
        layers = [l for l, _ in self.heads] + list(self.mlps)
        return min(layers) if layers else None

    def with_mlps(self, mlps: Iterable[int], source: str = "") -> Components:
        return Components(self.heads, tuple(mlps), " + ".join(s for s in (self.source, source) if s))

    def to_json(self) -> dict:
        return {"heads": [h.to_json() for h in self.heads], "mlps": list(self.mlps), "source": self.source}

    @classmethod
    def from_json(cls, data: dict) -> Components:
        data = {"heads": [], "mlps": [], "source": "explicit"} | data  # a file written by hand may give heads only
        return cls(tuple(heads_of(data["heads"])), tuple(data["mlps"]), data["source"])

    # ---- the ways to choose ---------------------------------------------------------------------
    @classmethod
    def explicit(cls, heads: str = "", mlps: str = "") -> Components:
        """From the command line: 'L.H,...' (or a file of heads, keyheads.heads.read_heads) and 'L,...'."""
        return cls(tuple(read_heads(heads)) if heads else (), tuple(parse_layers(mlps)), "explicit")

    @classmethod
    def select(cls, effects: Effects, threshold: float | None = None, top_k: int | None = None,
               n_mlps: int = 0, name: str = "effects.json") -> Components:
        """The key heads of `effects` by `rank_heads`, and its `n_mlps` most negative MLPs.

        With neither threshold nor top_k the paper's -5% applies. An empty choice is an error that
        names the threshold and the best head, since every later stage would be meaningless; so is
        asking for more heads or MLPs than were measured.
        """
        if n_mlps < 0:
            raise UserError(f"--mlps must be >= 0, got {n_mlps}")
        if top_k is not None and (top_k < 0 or (top_k == 0 and not n_mlps)):
            raise UserError(f"--top-k must be positive, got {top_k}")
        cut = cut_of(threshold, top_k)
        heads = rank_heads(effects, cut, top_k)
        measured = rank_heads(effects)
        if top_k and cut is None and len(heads) < top_k:
            raise UserError(f"{name} has only {len(measured)} measured heads; asked for the top {top_k}")
        if not heads and top_k != 0:
            best = f" (the most negative is {measured[0]} at {effects.effect(measured[0]):+.4f})" if measured else ""
            raise UserError(f"no head has an effect below the threshold {cut:+g}{best}; "
                            "lower it with --threshold or choose the number of heads with --top-k")
        mlps = rank_mlps(effects)
        if n_mlps > len(mlps):
            raise UserError(f"{name} has only {len(mlps)} measured MLPs; asked for the top {n_mlps}")
        what = f"top-{top_k} heads" if cut is None else f"heads below {cut:+g}" + (f", top {top_k}" if top_k else "")
        return cls(tuple(heads), tuple(mlps[:n_mlps]),
                   what + (f" + top-{n_mlps} MLPs" if n_mlps else "") + f" of {name}")

    @classmethod
    def read_key_heads(cls, path: str | Path) -> Components:
        """The key heads that identify chose, from its key_heads.json (its heads only, in its order)."""
        path = Path(path)
        if not path.is_file():
            raise MissingFile(f"{path} does not exist (identify writes it: `keyheads identify` or the identify stage)")
        record = read_json(path)
        if not isinstance(record, dict) or not isinstance(record.get("heads"), list):
            raise BadFile(f"{path}: no 'heads' list (expected the key_heads.json written by `keyheads identify`)")
        if not record["heads"]:
            raise UserError(f"no key heads in {path}: no head passed threshold {record.get('threshold')}; "
                            "set top_k in the config")
        return cls(tuple(heads_of(record["heads"])), (), f"key heads ({path.parent.name}/{path.name})")

    @classmethod
    def random_heads(cls, k: int, n_layers: int, n_heads: int, seed: int = 0) -> Components:
        """k heads drawn uniformly without replacement (the control for key heads)."""
        every = [Head(l, h) for l in range(n_layers) for h in range(n_heads)]
        if not 1 <= k <= len(every):
            raise UserError(f"--random-heads must be between 1 and {len(every)} (the model's heads), got {k}")
        return cls(tuple(random.Random(seed).sample(every, k)), (), f"random {k} heads, seed {seed}")

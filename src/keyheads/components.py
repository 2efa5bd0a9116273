"""Which heads and MLP layers a stage works on: one small type, passed between stages as data.

A `Components` is built from key heads (effects.json / key_heads.json), an explicit list, or a
seeded random draw, and checked against a model once; later code never parses "L.H" strings.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple

from .errors import UserError

class Head(NamedTuple):
    """One attention head: the paper's central object, and the one type for it everywhere.

    A tuple, so it sorts by layer then head and unpacks as `layer, head = h`. "L.H" text appears
    only where people type or read it (flags, YAML, tables): `Head.parse` and `str(head)`.
    In JSON files a head is {"layer": L, "head": H}.
    """

    layer: int
    head: int

    def __str__(self) -> str:
        return f"{self.layer}.{self.head}"

    @classmethod
    def parse(cls, text: str) -> "Head":
        """'14.2' -> Head(14, 2), with an error naming the bad text."""
        layer, dot, head = text.strip().partition(".")
        if not dot or not layer.isdigit() or not head.isdigit():
            raise UserError(f"head {text.strip()!r} is not of the form LAYER.HEAD (for example 14.2)")
        return cls(int(layer), int(head))

    def to_json(self) -> dict:
        return {"layer": self.layer, "head": self.head}

    @classmethod
    def from_json(cls, data) -> "Head":
        """{"layer": L, "head": H} (or a [L, H] pair)."""
        if isinstance(data, dict):
            return cls(int(data["layer"]), int(data["head"]))
        layer, head = data
        return cls(int(layer), int(head))


def parse_head_list(spec: str) -> list[Head]:
    """'14.2,21.2' -> [(14, 2), (21, 2)], with an error naming the bad item."""
    heads = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        layer, dot, head = item.partition(".")
        if not dot or not layer.isdigit() or not head.isdigit():
            raise ValueError(f"head {item!r} is not of the form LAYER.HEAD (for example 14.2)")
        heads.append((int(layer), int(head)))
    return heads


def parse_layer_list(spec: str) -> list[int]:
    """'19,24' -> [19, 24]."""
    layers = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if not item.isdigit():
            raise ValueError(f"layer {item!r} is not a non-negative integer")
        layers.append(int(item))
    return layers


@dataclass(frozen=True)
class Components:
    """Attention heads and whole MLP layers.

    Attributes:
        heads: (layer, head) pairs in selection order (most important first when ranked).
        mlps: MLP layers in selection order.
        source: how they were chosen, for reports ("top-32 of effects.json", "random 32, seed 0", ...).
    """

    heads: tuple[Head, ...] = ()
    mlps: tuple[int, ...] = ()
    source: str = "explicit"

    def __post_init__(self):
        object.__setattr__(self, "heads", tuple((int(l), int(h)) for l, h in self.heads))
        object.__setattr__(self, "mlps", tuple(int(m) for m in self.mlps))
        if len(set(self.heads)) != len(self.heads):
            raise ValueError(f"a head is listed twice in {self.head_labels()}")
        if len(set(self.mlps)) != len(self.mlps):
            raise ValueError(f"an MLP layer is listed twice in {list(self.mlps)}")

    def head_labels(self) -> list[str]:
        return [f"{l}.{h}" for l, h in self.heads]

    def heads_by_layer(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for layer, head in sorted(self.heads):
            out.setdefault(layer, []).append(head)
        return out

    def check(self, n_layers: int, n_heads: int) -> "Components":
        for layer, head in self.heads:
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise ValueError(f"head {layer}.{head} does not exist: the model has {n_layers} layers x {n_heads} "
                                 f"heads (layers 0..{n_layers - 1}, heads 0..{n_heads - 1})")
        for layer in self.mlps:
            if not 0 <= layer < n_layers:
                raise ValueError(f"MLP layer {layer} does not exist: the model has layers 0..{n_layers - 1}")
        return self

    def lowest_layer(self) -> int | None:
        layers = [l for l, _ in self.heads] + list(self.mlps)
        return min(layers) if layers else None

    def with_mlps(self, mlps: Iterable[int], source: str = "") -> "Components":
        return Components(self.heads, tuple(mlps), " + ".join(s for s in (self.source, source) if s))

    def to_json(self) -> dict:
        return {"heads": self.head_labels(), "mlps": list(self.mlps), "source": self.source}

    @classmethod
    def from_json(cls, data: dict) -> "Components":
        return cls(tuple(parse_head_list(",".join(data.get("heads", [])))), tuple(data.get("mlps", [])),
                   data.get("source", "explicit"))

    # ---- ways to choose --------------------------------------------------------------------
    @classmethod
    def explicit(cls, heads: str = "", mlps: str = "") -> "Components":
        return cls(tuple(parse_head_list(heads)), tuple(parse_layer_list(mlps)), "explicit")

    @classmethod
    def top_k(cls, effects_path: str | Path, k: int, n_mlps: int = 0, model=None) -> "Components":
        """The k most negative heads (and the n_mlps most negative MLPs) of an effects.json."""
        from .patching.results import Effects

        if k < 0 or n_mlps < 0:
            raise ValueError(f"--top-k and --mlps must be >= 0, got {k} and {n_mlps}")
        effects = Effects.load(effects_path, model)
        heads = [h for h in effects.ranked() if effects.effect(h) == effects.effect(h)][:k]  # NaN never chosen
        if len(heads) < k:
            raise ValueError(f"{effects_path} has only {len(heads)} measured heads; asked for the top {k}")
        ranked_mlps = sorted((v, l) for l, v in enumerate(effects.mlps) if v == v)
        if n_mlps > len(ranked_mlps):
            raise ValueError(f"{effects_path} has only {len(ranked_mlps)} measured MLPs; asked for the top {n_mlps}")
        return cls(tuple(heads), tuple(l for _, l in ranked_mlps[:n_mlps]),
                   f"top-{k} heads" + (f" + top-{n_mlps} MLPs" if n_mlps else "") + f" of {Path(effects_path).name}")

    @classmethod
    def random_heads(cls, k: int, n_layers: int, n_heads: int, seed: int = 0) -> "Components":
        """k heads drawn uniformly without replacement (the control for key heads)."""
        every = [(l, h) for l in range(n_layers) for h in range(n_heads)]
        if not 1 <= k <= len(every):
            raise ValueError(f"--random-heads must be between 1 and {len(every)} (the model's heads), got {k}")
        return cls(tuple(random.Random(seed).sample(every, k)), (), f"random {k} heads, seed {seed}")

"""The attention head: the paper's central object, one type everywhere, one parser.

In memory a head is a `Head(layer, head)`: a tuple, so it sorts by layer then head and unpacks as
`layer, head = h`. In JSON files it is {"layer": L, "head": H}. The text "L.H" (for example "14.2")
appears only where people type or read heads: flags, YAML, tables and plots; `parse_heads` reads it
and `str(head)` writes it.
"""
from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from . import circuits
from .errors import BadFile, MissingFile, UserError
from .io import read_json


class Head(NamedTuple):
    layer: int
    head: int

    def __str__(self) -> str:
        return f"{self.layer}.{self.head}"

    @classmethod
    def parse(cls, text: str) -> Head:
        """'14.2' -> Head(14, 2), with an error naming the bad text."""
        layer, dot, head = text.strip().partition(".")
        if not dot or not layer.isdigit() or not head.isdigit():
            raise UserError(f"head {text.strip()!r} is not of the form LAYER.HEAD (for example 14.2)")
        return cls(int(layer), int(head))

    def to_json(self) -> dict:
        return {"layer": self.layer, "head": self.head}

    @classmethod
    def from_json(cls, data) -> Head:
        """{"layer": L, "head": H} or an [L, H] pair."""
        try:
            if isinstance(data, dict):
                return cls(int(data["layer"]), int(data["head"]))
            layer, head = data
            return cls(int(layer), int(head))
        except (KeyError, TypeError, ValueError):
            raise UserError(f"cannot read a head from {data!r}: expected {{\"layer\": L, \"head\": H}}") from None


def parse_heads(spec: str) -> list[Head]:
    """'14.2,21.2' -> [Head(14, 2), Head(21, 2)] (blanks and empty items ignored)."""
    return [Head.parse(item) for item in spec.split(",") if item.strip()]


def parse_layers(spec: str) -> list[int]:
    """'19,24' -> [19, 24]."""
    layers = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if not item.isdigit():
            raise UserError(f"layer {item!r} is not a non-negative integer")
        layers.append(int(item))
    return layers


def heads_of(items: Iterable) -> list[Head]:
    """Heads from JSON-like items (Head, [L, H] or {"layer", "head"}): the one reader of stored heads."""
    return [Head.from_json(x) for x in items]


def read_heads(spec: str) -> list[Head]:
    """Heads as a user gives them: 'L.H,...', or a JSON or CSV file of them (in file order).

    JSON: a list of heads ({"layer", "head"}, [L, H] or "L.H"), or an object with such a list under
    "heads" (key_heads.json and `keyheads export`'s hooks.json are), or a MIB / EAP-IG circuit graph (its head
    nodes with in_graph true, keyheads.circuits). CSV: columns layer and head, or one column of "L.H".
    """
    path = Path(spec)
    if path.suffix.lower() not in (".json", ".csv", ".pt"):
        return parse_heads(spec)
    if not path.is_file():
        raise MissingFile(f"key-head file {path} does not exist")
    if path.suffix.lower() == ".pt":  # EAP-IG's Graph.to_pt
        try:
            return graph_heads(circuits.load_graph_file(path), path)
        except ValueError as err:
            raise BadFile(f"{path}: {err}") from None
    if path.suffix.lower() == ".json":
        data = read_json(path)
        if circuits.is_graph(data):
            return graph_heads(data, path)
        if isinstance(data, dict):
            data = data.get("heads")
        if not isinstance(data, list):
            raise BadFile(f"{path}: expected a list of heads or an object with a 'heads' list")
        return [Head.parse(x) if isinstance(x, str) else Head.from_json(x) for x in data]
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if rows and {"layer", "head"} <= set(rows[0]):
        layer, head = rows[0].index("layer"), rows[0].index("head")
        return [Head(int(r[layer]), int(r[head])) for r in rows[1:] if r]
    if rows and all(len(r) == 1 for r in rows if r):  # one column of L.H, with or without a header
        cells = [r[0] for r in rows if r]
        first = [] if "." not in cells[0] else [cells[0]]
        return [Head.parse(c) for c in first + cells[1:]]
    raise BadFile(f"{path}: expected CSV columns layer and head, or one column of LAYER.HEAD")


def graph_heads(data, path: Path) -> list[Head]:
    """The heads in the graph of a MIB / EAP-IG circuit file's content (model order)."""
    try:
        circuit = circuits.read_graph(data)
    except ValueError as err:
        raise BadFile(f"{path}: {err}") from None
    if not circuit.heads:
        raise BadFile(f"{path}: no attention-head node (a{{L}}.h{{H}}) has in_graph true, so the circuit has no "
                      "heads; give its node scores as --effects with --top-k instead")
    return [Head(layer, head) for layer, head in circuit.heads]

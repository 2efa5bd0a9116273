"""Circuits in other tools' formats: the MIB circuit-track / EAP-IG graph JSON, and TransformerLens hook names.

The graph file is what EAP-IG's `Graph.to_json` writes and `Graph.from_json` reads (the MIB circuit track's
loader is a copy of it):

    {"cfg":   {"n_layers", "n_heads", "parallel_attn_mlp", "d_model"},
     "nodes": {"input" | "a{L}.h{H}" | "m{L}" | "logits": {"in_graph": bool[, "score": float]}},
     "edges": {"{parent}->{child}" or "{parent}->a{L}.h{H}<q|k|v>": {"score": float, "in_graph": bool}}}

Nodes and edges are in EAP-IG's order (`Graph.from_model`). A node "score" is a node-level attribution (null or
NaN: not scored); the readers skip "logits", and EAP-IG's writer fails on a logits score, so it is written without
one. MIB counts grouped-query attention ungrouped (n_heads = query heads), as keyheads numbers heads. EAP-IG's
`Graph.to_pt` file holds the same in tensors ('src_nodes', 'dst_nodes', 'edges_scores', 'edges_in_graph',
'nodes_in_graph'[, 'nodes_scores']); `load_graph_file` reads it (torch.load with weights_only) into this form.

In the circuit: the heads and MLPs whose node has in_graph true; in a file whose nodes mark none, the ends of
every edge with in_graph true. Node scores: the file's; an edge-level file without them gets, for each node,
the sum of |score| over its outgoing edges (the edges it sends to later nodes and the logits), so that a node
through which much attribution flows ranks high. A neuron mask ('neurons' with some false) is refused: keyheads
takes heads and MLPs whole, and would silently widen the circuit.

keyheads writes its export in MIB's convention, higher = more important: a node's score is minus its effect
(effects are most negative where most important), and an edge's score is the lesser of its two ends' scores
(input and logits count as the other end), so edges between important nodes come first in MIB's top-n; the
effects themselves sit unchanged in a top-level "keyheads" object, which both EAP-IG and MIB ignore, and keyheads
reads them back from it. The file is strict JSON: an unscored node has null. A file from another tool has no sign
convention keyheads can trust, so its heads are ranked by |score|: the effect keyheads reads is -|score| (most
negative = largest attribution), and top_k / threshold apply to that as to effects.json.

This module works on plain (layer, head) pairs and lists so that keyheads.heads and keyheads.effects can both
read these files without a cycle; it loads without torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KEYHEADS_KEY = "keyheads"  # the top-level object of a keyheads export: the effects.json fields besides the scores
# a node's fields in MIB's files (absent: None)
NODE_FIELDS: dict[str, Any] = {"in_graph": None, "score": None, "neurons": None}


def head_node(layer: int, head: int) -> str:
    return f"a{layer}.h{head}"


def mlp_node(layer: int) -> str:
    return f"m{layer}"


def node_names(n_layers: int, n_heads: int) -> list[str]:
    """input, a0.h0 .. a0.h{H-1}, m0, a1.h0, ..., m{N-1}, logits: EAP-IG's order."""
    names = ["input"]
    for layer in range(n_layers):
        names += [head_node(layer, h) for h in range(n_heads)] + [mlp_node(layer)]
    return names + ["logits"]


def edge_names(n_layers: int, n_heads: int, parallel_attn_mlp: bool) -> list[tuple[str, str, str]]:
    """(edge name, parent, child) in EAP-IG's order: into each layer's heads (q, k, v), then its MLP, then logits.
    A sequential block's MLP also reads its own layer's heads; a parallel one's does not."""
    edges: list[tuple[str, str, str]] = []
    upstream = ["input"]
    for layer in range(n_layers):
        heads = [head_node(layer, h) for h in range(n_heads)]
        mlp = mlp_node(layer)
        for parent in upstream:
            for child in heads:
                edges += [(f"{parent}->{child}<{qkv}>", parent, child) for qkv in "qkv"]
            if parallel_attn_mlp:
                edges.append((f"{parent}->{mlp}", parent, mlp))
        upstream = upstream + heads
        if not parallel_attn_mlp:
            edges += [(f"{parent}->{mlp}", parent, mlp) for parent in upstream]
        upstream.append(mlp)
    return edges + [(f"{parent}->logits", parent, "logits") for parent in upstream]


def _importance(effect: float) -> float | None:
    """A node's score in MIB's convention (higher = more important) from a keyheads effect; None (JSON null) for
    one not measured."""
    return None if math.isnan(effect) else -float(effect)


def graph_json(head_scores: list[list[float]], mlp_scores: list[float], heads: list[tuple[int, int]],
               mlps: list[int], d_model: int, parallel_attn_mlp: bool = False,
               keyheads: dict[str, Any] | None = None) -> dict[str, Any]:
    """The graph file of a node-level circuit: `heads` and `mlps` in the graph (with input and logits), every node
    scored by minus its effect, every edge by the lesser of its ends' scores; an edge is in the graph when both its
    ends are. `keyheads` (the export's effects and settings) gets the effects as they are."""
    n_layers, n_heads = len(head_scores), len(head_scores[0]) if head_scores else 0
    chosen = {"input", "logits"} | {head_node(l, h) for l, h in heads} | {mlp_node(l) for l in mlps}
    nodes: dict[str, Any] = {"input": {"in_graph": True, "score": None}}
    for layer in range(n_layers):
        for head in range(n_heads):
            name = head_node(layer, head)
            nodes[name] = {"in_graph": name in chosen, "score": _importance(head_scores[layer][head])}
        nodes[mlp_node(layer)] = {"in_graph": mlp_node(layer) in chosen, "score": _importance(mlp_scores[layer])}
    nodes["logits"] = {"in_graph": True}  # no score: EAP-IG's writer and reader both fail on one

    def edge_score(parent: str, child: str) -> float:
        ends = [nodes[n]["score"] for n in (parent, child) if n not in ("input", "logits")]
        known = [v for v in ends if v is not None]
        return min(known) if known else 0.0

    edges = {name: {"score": edge_score(parent, child), "in_graph": parent in chosen and child in chosen}
             for name, parent, child in edge_names(n_layers, n_heads, parallel_attn_mlp)}
    out: dict[str, Any] = {"cfg": {"n_layers": n_layers, "n_heads": n_heads,
                                   "parallel_attn_mlp": bool(parallel_attn_mlp), "d_model": int(d_model)},
                           "nodes": nodes, "edges": edges}
    if keyheads is not None:
        out[KEYHEADS_KEY] = {**keyheads, "heads": [[_finite(v) for v in row] for row in head_scores],
                             "mlps": [_finite(v) for v in mlp_scores]}
    return out


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def hooks_json(heads: list[tuple[int, int]], mlps: list[int]) -> dict[str, Any]:
    """The circuit as TransformerLens hook points: a head is index 2 of blocks.L.attn.hook_result
    ([batch, pos, head, d_model]; hook_z holds the same head before W_O); an MLP is blocks.L.hook_mlp_out.
    "heads" holds {"layer", "head"} items, so the file is also a key-head list keyheads reads."""
    return {
        "heads": [{"layer": l, "head": h, "node": head_node(l, h), "hook": f"blocks.{l}.attn.hook_result",
                   "hook_z": f"blocks.{l}.attn.hook_z", "index": [None, None, h],
                   "name": f"blocks.{l}.attn.hook_result[:, :, {h}]"} for l, h in heads],
        "mlps": [{"layer": l, "node": mlp_node(l), "hook": f"blocks.{l}.hook_mlp_out"} for l in mlps],
    }


# ---- reading ----------------------------------------------------------------------------------------------


@dataclass
class Circuit:
    """A graph file as keyheads uses it: its shape, the heads and MLPs in the graph (model order), the node
    scores (None: the file has none; NaN: a node not scored) and the keyheads object of an export."""

    n_layers: int
    n_heads: int
    heads: list[tuple[int, int]]
    mlps: list[int]
    head_scores: list[list[float]] | None
    mlp_scores: list[float] | None
    keyheads: dict[str, Any] | None = field(default=None)


def is_graph(data: Any) -> bool:
    """Whether JSON content is meant as a graph file: an object with any of its keys "cfg", "nodes", "edges"
    (read_graph then says which is missing or wrong) and not a keyheads file (those have "heads")."""
    return isinstance(data, dict) and "heads" not in data and bool({"cfg", "nodes", "edges"} & data.keys())


def _parse_node(name: str, n_layers: int, n_heads: int) -> tuple[str, int, int]:
    """("input" | "logits" | "head" | "mlp", layer, head) of a node name; a ValueError names a bad one."""
    if name in ("input", "logits"):
        return name, -1, -1
    if name.startswith("a") and ".h" in name:
        layer, _, head = name[1:].partition(".h")
        if layer.isdigit() and head.isdigit():
            if not (int(layer) < n_layers and int(head) < n_heads):
                raise ValueError(f"node {name!r} is outside the graph's cfg of {n_layers} layers x {n_heads} heads")
            return "head", int(layer), int(head)
    if name.startswith("m") and name[1:].isdigit():
        if not int(name[1:]) < n_layers:
            raise ValueError(f"node {name!r} is outside the graph's cfg of {n_layers} layers")
        return "mlp", int(name[1:]), -1
    raise ValueError(f"node {name!r} is not one of input, a{{L}}.h{{H}}, m{{L}}, logits")


def _count(cfg: dict, key: str) -> int:
    value = cfg[key] if key in cfg else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"cfg.{key} must be a positive integer, got {value!r}")
    return value


def _parallel(cfg: dict) -> bool:
    """Whether the graph's model runs attention and MLP side by side (EAP-IG's cfg; absent: it does not)."""
    return bool(cfg["parallel_attn_mlp"]) if "parallel_attn_mlp" in cfg else False


def read_graph(data: Any) -> Circuit:
    """A graph file's content as a Circuit; a ValueError says what is malformed (the caller names the file).

    A node's value is {"in_graph": bool[, "score": number]} (older MIB files: a bare bool). Edges are checked
    by name against the cfg, as EAP-IG's reader would fail on an unknown one."""
    missing = [k for k in ("cfg", "nodes", "edges") if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"not a MIB / EAP-IG circuit graph: no {', '.join(map(repr, missing))} (expected an "
                         "object with 'cfg', 'nodes' and 'edges')")
    cfg, nodes, edges = data["cfg"], data["nodes"], data["edges"]
    if not isinstance(cfg, dict) or not isinstance(nodes, dict) or not isinstance(edges, dict):
        raise ValueError("'cfg', 'nodes' and 'edges' must be JSON objects")
    n_layers, n_heads = _count(cfg, "n_layers"), _count(cfg, "n_heads")
    head_scores = [[math.nan] * n_heads for _ in range(n_layers)]
    mlp_scores = [math.nan] * n_layers
    heads, mlps, scored = [], [], False
    for name, value in nodes.items():
        kind, layer, head = _parse_node(name, n_layers, n_heads)
        if isinstance(value, bool):
            value = {"in_graph": value}
        node = NODE_FIELDS | value if isinstance(value, dict) else NODE_FIELDS
        if not isinstance(node["in_graph"], bool):
            raise ValueError(f"node {name!r}: expected {{\"in_graph\": true|false[, \"score\": number]}}, "
                             f"got {value!r}")
        score, neurons = node["score"], node["neurons"]
        if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)):
            raise ValueError(f"node {name!r}: score must be a number, got {score!r}")
        if node["in_graph"] and isinstance(neurons, list) and not all(neurons):
            raise ValueError(f"node {name!r} keeps {sum(map(bool, neurons))} of its {len(neurons)} neurons (a MIB "
                             "neuron-level circuit); keyheads takes heads and MLPs whole and would widen the circuit: "
                             "make a node-level graph of it (in_graph per node), or give the heads with --heads")
        if isinstance(score, float) and math.isnan(score):
            score = None
        if kind == "head":
            if node["in_graph"]:
                heads.append((layer, head))
            if score is not None:
                head_scores[layer][head], scored = float(score), True
        elif kind == "mlp":
            if node["in_graph"]:
                mlps.append(layer)
            if score is not None:
                mlp_scores[layer], scored = float(score), True
    known: dict[str, tuple[str, str]] | None = None
    sent_heads = [[0.0] * n_heads for _ in range(n_layers)]
    sent_mlps = [0.0] * n_layers
    edge_scored = False
    edge_heads: list[tuple[int, int]] = []
    edge_mlps: list[int] = []
    for name, value in edges.items():
        if not isinstance(value, dict) or not {"score", "in_graph"} <= value.keys():
            raise ValueError(f"edge {name!r}: expected {{\"score\": number, \"in_graph\": true|false}}, got {value!r}")
        if known is None:
            known = {e: (a, b) for e, a, b in edge_names(n_layers, n_heads, _parallel(cfg))}
        if name not in known:
            raise ValueError(f"edge {name!r} is not an edge of the graph its cfg describes (names are "
                             "'PARENT->CHILD', with <q>, <k> or <v> after a head child)")
        for end in known[name] if value["in_graph"] else ():  # the ends of an in-graph edge
            kind, layer, head = _parse_node(end, n_layers, n_heads)
            if kind == "head" and (layer, head) not in edge_heads:
                edge_heads.append((layer, head))
            elif kind == "mlp" and layer not in edge_mlps:
                edge_mlps.append(layer)
        score = value["score"]
        if isinstance(score, int | float) and not isinstance(score, bool) and score == score and score != 0:
            kind, layer, head = _parse_node(known[name][0], n_layers, n_heads)
            edge_scored = True
            if kind == "head":
                sent_heads[layer][head] += abs(score)
            elif kind == "mlp":
                sent_mlps[layer] += abs(score)
    if not scored and edge_scored:  # an edge-level file: each node scored by the |score| it sends on
        head_scores, mlp_scores, scored = sent_heads, sent_mlps, True
    if not heads and not mlps:  # the nodes mark none: the circuit is the ends of its in-graph edges
        heads, mlps = edge_heads, edge_mlps
    extra = data[KEYHEADS_KEY] if KEYHEADS_KEY in data else None
    return Circuit(n_layers, n_heads, sorted(heads), sorted(mlps), head_scores if scored else None,
                   mlp_scores if scored else None, extra if isinstance(extra, dict) else None)


def load_graph_file(path: str | Path) -> Any:
    """A circuit file's content in the JSON form read_graph takes: JSON as it is (NaN accepted), or EAP-IG's
    `Graph.to_pt` file, read with torch.load(weights_only=True) and laid out by node and edge name."""
    path = Path(path)
    if path.suffix.lower() != ".pt":
        from .io import read_json  # noqa: PLC0415

        return read_json(path)
    import torch  # noqa: PLC0415 -- only a .pt graph needs it

    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 -- torch says what is wrong in many ways
        raise ValueError(f"not a graph torch.load can read with weights_only=True ({type(err).__name__}: {err})") \
            from None
    need = ("cfg", "src_nodes", "dst_nodes", "edges_scores", "edges_in_graph", "nodes_in_graph")
    if not isinstance(d, dict) or any(k not in d for k in need):
        raise ValueError(f"not an EAP-IG Graph.to_pt file: expected the keys {', '.join(need)}")
    src, dst = list(d["src_nodes"]), list(d["dst_nodes"])
    scores, in_graph = d["edges_scores"].tolist(), d["edges_in_graph"].tolist()
    node_scores = d["nodes_scores"].tolist() if d.get("nodes_scores") is not None else None
    neurons = d["neurons_in_graph"].tolist() if d.get("neurons_in_graph") is not None else None
    nodes: dict[str, Any] = {}
    for i, name in enumerate(src):
        nodes[name] = {"in_graph": bool(d["nodes_in_graph"][i])}
        if node_scores is not None:
            nodes[name]["score"] = node_scores[i]
        if neurons is not None:
            nodes[name]["neurons"] = [bool(x) for x in neurons[i]]
    cfg = dict(d["cfg"])
    where = {n: i for i, n in enumerate(src)}
    into = {n: j for j, n in enumerate(dst)}
    edges = {}
    for name, parent, child in edge_names(int(cfg["n_layers"]), int(cfg["n_heads"]),
                                          bool(cfg.get("parallel_attn_mlp", False))):
        target = child + name[name.index("<"):] if name.endswith(">") else child
        i, j = where[parent], into[target]
        edges[name] = {"score": float(scores[i][j]), "in_graph": bool(in_graph[i][j])}
    return {"cfg": cfg, "nodes": nodes, "edges": edges}


def effects_fields(circuit: Circuit) -> dict[str, Any]:
    """The fields of an effects.json that a graph file gives: a keyheads export's effects as written; another
    tool's node scores as -|score| (see the module's note). A graph without node scores has no effects."""
    if circuit.keyheads is not None and "heads" in circuit.keyheads:  # a keyheads export: its own effects
        def unscored(v):
            return math.nan if v is None else v

        return {**circuit.keyheads, "heads": [[unscored(v) for v in row] for row in circuit.keyheads["heads"]],
                "mlps": [unscored(v) for v in circuit.keyheads["mlps"]]}
    if circuit.head_scores is None or circuit.mlp_scores is None:
        raise ValueError("it has no node or edge scores, so nothing to rank heads by: give it as --heads (its "
                         "nodes with in_graph true), or as `keyheads run --circuit`, which then patches the run's "
                         "own pairs for the effects")
    if circuit.keyheads is not None:  # an export of an earlier release: the node scores were the effects
        return {**circuit.keyheads, "heads": circuit.head_scores, "mlps": circuit.mlp_scores}
    return {"metric": "node score (-|score|)", "method": "circuit graph", "model": "", "n_samples": 0,
            "n_excluded": 0, "data_sha256": None,
            "heads": [[-abs(v) for v in row] for row in circuit.head_scores],
            "mlps": [-abs(v) for v in circuit.mlp_scores]}

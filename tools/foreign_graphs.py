"""Circuit files in the forms other tools write, made from a keyheads effects.json, to drive `keyheads run --circuit`
and `--heads` with a real model's shape (tests/test_run_circuit.py does the same on a tiny model):

    python tools/foreign_graphs.py records/table1-smollm2-rates/cells/identify/run/identify/effects.json OUT

writes into OUT:
- edges.json: EAP-IG's `Graph.to_json` at edge level: every edge scored, no node scores, the top heads' and the
  last two MLPs' edges in the graph (an edge's score is its sender's importance shared over the edges it sends);
- graph.pt: the same graph as EAP-IG's `Graph.to_pt` saves it;
- mib.json: the same graph in the schema of MIB's published circuit files (for `--heads`);
- ingraph.json: the same in_graph marks with every score 0 (a circuit that selects heads and scores nothing).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from keyheads import circuits
from keyheads.effects import Effects
from keyheads.testing.eap_ig import write_pt


def graph(effects: Effects, top: int, d_model: int) -> dict:
    n_layers, n_heads = len(effects.heads), len(effects.heads[0])
    score = {circuits.head_node(l, h): -effects.heads[l][h] for l in range(n_layers) for h in range(n_heads)}
    score.update({circuits.mlp_node(l): -effects.mlps[l] for l in range(n_layers)})
    score = {k: 0.0 if math.isnan(v) else v for k, v in score.items()}
    heads = sorted((k for k in score if k.startswith("a")), key=lambda k: -abs(score[k]))[:top]
    chosen = {"input", "logits", *heads, circuits.mlp_node(n_layers - 1), circuits.mlp_node(n_layers - 2)}
    nodes = {"input": {"in_graph": True}}
    for layer in range(n_layers):
        for head in range(n_heads):
            nodes[circuits.head_node(layer, head)] = {"in_graph": circuits.head_node(layer, head) in chosen}
        nodes[circuits.mlp_node(layer)] = {"in_graph": circuits.mlp_node(layer) in chosen}
    nodes["logits"] = {"in_graph": True}
    names = circuits.edge_names(n_layers, n_heads, False)
    sent: dict[str, int] = {}
    for _, parent, _child in names:
        sent[parent] = sent.get(parent, 0) + 1
    edges = {name: {"score": score.get(parent, 0.0) / sent[parent], "in_graph": parent in chosen and child in chosen}
             for name, parent, child in names}
    cfg = {"n_layers": n_layers, "n_heads": n_heads, "parallel_attn_mlp": False, "d_model": d_model}
    return {"cfg": cfg, "nodes": nodes, "edges": edges}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("effects", help="an effects.json (keyheads identify)")
    parser.add_argument("out", help="the folder to write the four files into")
    parser.add_argument("--top", type=int, default=10, help="heads in the graph")
    parser.add_argument("--d-model", type=int, default=576, help="the model's width (SmolLM2-135M: 576)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = graph(Effects.load(args.effects), args.top, args.d_model)
    for name in ("edges.json", "mib.json"):
        (out / name).write_text(json.dumps(data))
    unscored = {**data, "edges": {k: {"score": 0.0, "in_graph": v["in_graph"]} for k, v in data["edges"].items()}}
    (out / "ingraph.json").write_text(json.dumps(unscored))
    write_pt(data, out / "graph.pt")
    print(f"{out}: {sum(n['in_graph'] for n in data['nodes'].values()) - 2} nodes in the graph, {len(data['edges'])} "
          "edges")


if __name__ == "__main__":
    main()

"""Graph files as EAP-IG writes them, for tests and tools that feed keyheads another tool's circuits."""
from __future__ import annotations

from pathlib import Path


def write_pt(data: dict, path: str | Path) -> None:
    """A graph (EAP-IG's JSON form) saved as EAP-IG's Graph.to_pt saves it: source and destination nodes (a head's
    q, k and v apart), [src, dst] tensors of edge scores and in_graph, and the nodes' in_graph."""
    import torch  # noqa: PLC0415 -- keyheads.testing imports without torch

    cfg, nodes = data["cfg"], data["nodes"]
    src = [n for n in nodes if n != "logits"]
    dst = []
    for layer in range(cfg["n_layers"]):
        dst += [f"a{layer}.h{h}<{q}>" for q in "qkv" for h in range(cfg["n_heads"])] + [f"m{layer}"]
    dst.append("logits")
    row, col = {n: i for i, n in enumerate(src)}, {n: i for i, n in enumerate(dst)}
    scores = torch.zeros(len(src), len(dst))
    in_graph = torch.zeros(len(src), len(dst), dtype=torch.bool)
    for name, edge in data["edges"].items():
        parent, child = name.split("->")
        scores[row[parent], col[child]] = edge["score"]
        in_graph[row[parent], col[child]] = edge["in_graph"]
    torch.save({"cfg": cfg, "src_nodes": src, "dst_nodes": dst, "edges_scores": scores, "edges_in_graph": in_graph,
                "nodes_in_graph": torch.tensor([nodes[n]["in_graph"] for n in src])}, path)

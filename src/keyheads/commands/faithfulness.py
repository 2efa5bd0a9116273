"""`keyheads faithfulness`: MIB's faithfulness curve, CPR and CMD of the circuits made of a circuit's top-scored heads
and MLPs (keyheads.faithfulness), on a pairs file.

    keyheads faithfulness --circuit runs/demo --data runs/demo/data/pairs.jsonl --out runs/demo/identify
    keyheads faithfulness --circuit ioi-eap-ig.json --data pairs.jsonl --out faith --ablation mean

It writes OUT/faithfulness.json and OUT/faithfulness.png; written into a run's identify/ folder, the figure is in
the run's report.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..config.commands import FaithfulnessCommand
from ..errors import BadFile
from .flags import add_settings, settings

FAITHFULNESS_JSON = "faithfulness.json"
FAITHFULNESS_PNG = "faithfulness.png"


def circuit_scores(path: Path, model) -> dict[str, float]:
    """Component name -> score, higher = more important: an effects file's -effect (a keyheads effect is most
    negative where it matters most; a foreign graph's node scores are read as -|score|, see keyheads.circuits)."""
    from ..circuits import head_node, mlp_node  # noqa: PLC0415
    from ..effects import Effects  # noqa: PLC0415
    from ..runfolder import EFFECTS_JSON  # noqa: PLC0415
    from .export import identify_folder  # noqa: PLC0415

    if path.is_dir():
        path = identify_folder(path) / EFFECTS_JSON
    effects = Effects.load(path, model)
    scores = {head_node(l, h): -v for l, row in enumerate(effects.heads) for h, v in enumerate(row)}
    scores.update({mlp_node(l): -v for l, v in enumerate(effects.mlps)})
    return {k: (math.nan if v != v else float(v)) for k, v in scores.items()}


def describe(curve) -> str:
    lines = [f"{'circuit':>8}  {'components':>10}  {'f(C)':>8}"]
    lines += [f"{100 * p:>7.1f}%  {n:>10}  {f:>8.4f}" for p, n, f in zip(curve.percentages, curve.sizes, curve.f)]
    lines.append(f"m(N) = {curve.m_full:.4f}, m(empty) = {curve.m_empty:.4f} (answer {curve.metric}, "
                 f"{curve.ablation} ablation, {curve.n_items} pairs)")
    lines.append(f"CPR (area under f) = {curve.cpr:.4f}   CMD (area between f and 1) = {curve.cmd:.4f}")
    return "\n".join(lines)


def in_graph(path: Path) -> list[str] | None:
    """The components a graph file marks in_graph when it scores none (None: it has scores, or is no graph)."""
    from .. import circuits  # noqa: PLC0415

    if path.is_dir() or path.suffix.lower() not in (".json", ".pt"):
        return None
    try:
        data = circuits.load_graph_file(path)
    except (ValueError, OSError):
        return None
    if not circuits.is_graph(data):
        return None
    try:
        graph = circuits.read_graph(data)
    except ValueError:
        return None  # Effects.load names the problem
    if graph.head_scores is not None or graph.keyheads is not None:
        return None
    return [circuits.head_node(l, h) for l, h in graph.heads] + [circuits.mlp_node(l) for l in graph.mlps]


def cmd_faithfulness(args) -> int:
    cfg: FaithfulnessCommand = settings(args)
    from ..faithfulness.curve import normalised  # noqa: PLC0415
    from ..faithfulness.plot import plot_curve  # noqa: PLC0415
    from ..faithfulness.run import faithfulness, measure  # noqa: PLC0415
    from ..io import file_sha256, write_json  # noqa: PLC0415
    from .models import load_from_args  # noqa: PLC0415

    model = load_from_args(cfg)
    out = Path(cfg.out)
    facts = {"model": cfg.model, "circuit": cfg.circuit, "pairs": cfg.data,
             "pairs_sha256": file_sha256(Path(cfg.data)), "ablation": cfg.ablation, "metric": cfg.metric,
             "positions": cfg.positions}
    marked = in_graph(Path(cfg.circuit))
    if marked is not None:  # no scores to rank by: the faithfulness of the circuit the file marks
        if not marked:
            raise BadFile(f"{cfg.circuit}: it scores no node or edge and marks none in_graph: nothing to measure")
        (m_full, m_empty, m), n = measure(model, cfg.data, [None, set(), set(marked)], cfg.ablation, cfg.mean,
                                          cfg.metric, cfg.limit, cfg.batch_size, progress=not cfg.quiet,
                                          positions=cfg.positions)
        f = normalised(m, m_full, m_empty)
        write_json(out / FAITHFULNESS_JSON, {**facts, "components": marked, "n_items": n, "m_full": m_full,
                                             "m_empty": m_empty, "m": m, "f": f})
        print(f"f(C) = {f:.4f} for the {len(marked)} heads and MLPs the file marks in_graph (it scores none, so "
              f"there is no curve): m(C) {m:.4f}, m(N) {m_full:.4f}, m(empty) {m_empty:.4f} ({n} pairs)")
        print(f"wrote {out / FAITHFULNESS_JSON}")
        return 0
    scores = circuit_scores(Path(cfg.circuit), model)
    curve = faithfulness(model, cfg.data, scores, absolute=cfg.absolute, ablation=cfg.ablation, mean=cfg.mean,
                         metric=cfg.metric, limit=cfg.limit, batch_size=cfg.batch_size, progress=not cfg.quiet,
                         positions=cfg.positions)
    write_json(out / FAITHFULNESS_JSON, {**facts, **curve.to_json()})
    plot_curve(curve, out / FAITHFULNESS_PNG)
    print(describe(curve))
    print(f"wrote {out / FAITHFULNESS_JSON} and {out / FAITHFULNESS_PNG}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("faithfulness", help="MIB's faithfulness (CPR, CMD) of the circuits of a circuit's top heads "
                                            "and MLPs")
    add_settings(p, FaithfulnessCommand)
    p.set_defaults(func=cmd_faithfulness)

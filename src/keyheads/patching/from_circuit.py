"""The identify step for a circuit found elsewhere: a run's key heads read from a MIB / EAP-IG graph file with node
scores, or from an effects.json (keyheads' own, or `keyheads export`'s graph), instead of patched.

It writes what the identify step writes, so every later stage (knockout, attention, MLPs, precise SFT, eval, the
report) runs on the circuit as on key heads keyheads found. The effects are the file's (another tool's node
scores enter as -|score|, keyheads.circuits); the key heads are the heads the graph puts in the circuit
(in_graph), ranked by their effect, or, for a file that marks none, the run's own rule (identify.top_k /
identify.threshold) applied to the effects.
"""
from __future__ import annotations

from pathlib import Path

from .. import circuits, distributed
from ..effects import Effects
from ..errors import BadFile
from ..io import write_json
from ..models.model import HookedModel
from ..results.identify import Identification, KeyHead, KeyHeads, KeyMLP
from ..runfolder import EFFECTS_JSON, KEY_HEADS_JSON
from .heatmap import draw_heatmap
from .settings import IdentifySettings


def _circuit(path: Path) -> circuits.Circuit | None:
    """The graph a circuit file holds (JSON or EAP-IG's .pt); None for an effects.json."""
    try:
        data = circuits.load_graph_file(path)
        return circuits.read_graph(data) if circuits.is_graph(data) else None
    except ValueError as err:
        raise BadFile(f"{path}: {err}") from None


def scoreless(path: str | Path) -> bool:
    """Whether `path` is a graph that marks its circuit but scores neither its nodes nor its edges: its effects
    must come from keyheads' own patching."""
    circuit = _circuit(Path(path))
    return circuit is not None and circuit.head_scores is None and circuit.keyheads is None


def in_circuit(path: Path, effects: Effects) -> KeyHeads | None:
    """The heads and MLPs a graph file puts in its circuit, most negative effect first; None when it is no graph
    or marks none."""
    circuit = _circuit(path)
    if circuit is None:
        return None
    if not circuit.heads:
        return None
    heads = sorted(circuit.heads, key=lambda lh: (effects.heads[lh[0]][lh[1]], lh))
    return KeyHeads(metric=effects.metric, threshold=None, top_k=None,
                    n_heads_total=sum(len(row) for row in effects.heads),
                    heads=[KeyHead(layer=layer, head=head, label=f"{layer}.{head}", effect=effects.heads[layer][head])
                           for layer, head in heads],
                    mlps=[KeyMLP(layer=layer, effect=effects.mlps[layer]) for layer in circuit.mlps])


def identify_from(path: str | Path, model: HookedModel, config: IdentifySettings, out: str | Path,
                  effects: Effects | None = None) -> Identification:
    """effects.json, key_heads.json and the heatmap in `out` from the circuit file at `path` (its effects, or
    `effects` when given: keyheads' own patching, for a file without scores); under several processes the main one
    writes and all return once the files are there."""
    path, out = Path(path), Path(out)
    if effects is None:
        effects = Effects.load(path, model)  # checks the file's layers x heads against the model
    chosen = in_circuit(path, effects) or KeyHeads.chosen(effects, threshold=config.threshold, top_k=config.top_k)
    if distributed.is_main():
        out.mkdir(parents=True, exist_ok=True)
        effects.write(out / EFFECTS_JSON)
        write_json(out / KEY_HEADS_JSON, chosen.to_json())
        draw_heatmap(effects, out / "heatmap.png", key=chosen.heads_ranked)
    distributed.barrier()  # a later stage on any rank may read these files
    return Identification(effects, chosen, seconds=0.0)

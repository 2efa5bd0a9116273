"""Measure a circuit's faithfulness curve (keyheads.faithfulness.curve) on a model and a pairs file, at node level:
the components are the attention heads and the MLPs, named as EAP-IG names them (a{layer}.h{head}, m{layer}).

A component outside the circuit is ablated where it writes, at every position, which is what MIB's node-level
evaluation does when it corrupts every edge leaving an out-of-graph node:
- counterfactual: its output is the one it has on the pair's counterfactual prompt (MIB's "patching");
- mean: its output is its mean over the counterfactual prompts (keyheads.knockout's means: "aligned", per position
  counted from END, is MIB's "mean-positional"; "global" is its "mean").
The embeddings and the unembedding are always in the circuit, as MIB's input and logits nodes are. The metric is
the answer token's logit at END (or its probability), averaged over the pairs.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..circuits import head_node, mlp_node
from ..data.pairs import read_pairs
from ..heads import Head
from ..knockout import Knockout, compute_means
from ..mean import DEFAULT_MEAN, KnockoutMean
from ..models import hf_internals
from ..models.model import HookedModel
from ..patching.samples import Batch, batches, load_patch_samples
from .curve import PERCENTAGES, Curve, ranked, sizes

Circuit = set[str] | frozenset[str]  # the names of the components it keeps
ABLATIONS = ("counterfactual", "mean")
POSITIONS = ("all", "end")  # where a component outside the circuit is ablated: MIB's (every position), or END only
METRICS = ("logit", "prob")  # the answer's logit or probability at END


def components(model: HookedModel) -> list[str]:
    """Every node-level component, in model order."""
    return [name for layer in range(model.n_layers)
            for name in [*(head_node(layer, h) for h in range(model.n_heads)), mlp_node(layer)]]


def _split(kept: Circuit, model: HookedModel) -> tuple[dict[int, list[int]], list[int]]:
    """The components outside `kept`: {layer: [heads]} and [mlp layers]."""
    heads: dict[int, list[int]] = {}
    mlps = []
    for layer in range(model.n_layers):
        out = [h for h in range(model.n_heads) if head_node(layer, h) not in kept]
        if out:
            heads[layer] = out
        if mlp_node(layer) not in kept:
            mlps.append(layer)
    return heads, mlps


def _capture_all(model: HookedModel, batch: Batch) -> dict[str, torch.Tensor]:
    """Every layer's per-head outputs and MLP writes on the batch's counterfactual prompts, at every position."""
    store: dict[str, torch.Tensor] = {}

    def grab(key: str) -> Callable[[torch.Tensor], torch.Tensor]:
        def edit(x: torch.Tensor) -> torch.Tensor:
            store[key] = x.detach().clone()
            return x
        return edit

    points = [f"{layer}.{name}" for layer in range(model.n_layers) for name in ("head_out", "mlp_write")]
    with model.hooks(edit={p: grab(p) for p in points}):
        if not hf_internals.forward_body(model.hf, input_ids=batch.cf, use_cache=False, **batch.inputs()):
            model.hf(input_ids=batch.cf, use_cache=False, **batch.inputs())
    return store


def _patch_edits(cf: dict[str, torch.Tensor], heads: dict[int, list[int]], mlps: list[int]) -> dict:
    """Edits that give the ablated components their counterfactual outputs."""
    edits: dict[str, Callable] = {}
    for layer, out in heads.items():
        index = torch.tensor(out)

        def head_edit(z, key=f"{layer}.head_out", index=index):
            z = z.clone()
            z[:, :, index] = cf[key][:, :, index].to(z)
            return z

        edits[f"{layer}.head_out"] = head_edit
    for layer in mlps:
        edits[f"{layer}.mlp_write"] = lambda x, key=f"{layer}.mlp_write": cf[key].to(x).clone()
    return edits


def _mean_edits(means: Knockout, heads: dict[int, list[int]], mlps: list[int]) -> dict:
    """Edits that give the ablated components their mean outputs."""
    chosen = [Head(layer, h) for layer, out in heads.items() for h in out]
    return Knockout(chosen, mlps, means.head_means, means.mlp_means, means.head_global, means.mlp_global,
                    mean=means.mean).edits()


def _at_end(edits: dict) -> dict:
    """The edits applied at END (the last position) only, every earlier position left as it is."""
    def end_only(edit: Callable) -> Callable:
        def apply(x: torch.Tensor) -> torch.Tensor:
            out = x.clone()
            out[:, -1] = edit(x)[:, -1]
            return out
        return apply

    return {point: end_only(edit) for point, edit in edits.items()}


def _quantity(metric: str, logits: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """The answer's logit or probability per row, in float64."""
    logits = logits.to(torch.float64)
    logit = logits.gather(-1, answer[:, None].to(logits.device))[:, 0]
    return (logit - logits.logsumexp(-1)).exp() if metric == "prob" else logit


@torch.no_grad()
def measure(model: HookedModel, pairs: str | Path, circuits: Sequence[Circuit | None],
            ablation: str = "counterfactual", mean: KnockoutMean = DEFAULT_MEAN, metric: str = "logit",
            limit: int | None = None, batch_size: int = 16, progress: bool = True,
            positions: str = "all") -> tuple[list[float], int]:
    """The metric averaged over the pairs for each circuit (None: the whole model, unablated) -> (values, n).
    `positions`: ablate outside the circuit at every position (MIB's) or at END only (where keyheads' patching
    methods measure each component's effect)."""
    if positions not in POSITIONS:
        raise ValueError(f"unknown positions {positions!r}: use one of {', '.join(POSITIONS)}")
    if ablation not in ABLATIONS:
        raise ValueError(f"unknown ablation {ablation!r}: use one of {', '.join(ABLATIONS)}")
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}: use one of {', '.join(METRICS)}")
    samples = load_patch_samples(model, pairs, limit=limit)
    means = None
    if ablation == "mean":
        counterfactuals = [p.counterfactual for p in read_pairs(pairs)][:len(samples)]
        every = [(layer, h) for layer in range(model.n_layers) for h in range(model.n_heads)]
        means = compute_means(model, counterfactuals, heads=every, mlps=range(model.n_layers), mean=mean,
                              progress=progress)
    split = [None if c is None else _split(c, model) for c in circuits]
    sums = torch.zeros(len(circuits), dtype=torch.float64)
    pad = model.tokenizer.pad_token_id or 0
    for batch in tqdm(list(batches(samples, batch_size, model.device, pad)), desc="faithfulness", disable=not progress):
        cf = _capture_all(model, batch) if ablation == "counterfactual" else None
        for i, out in enumerate(split):
            if out is None:
                edits = {}
            elif cf is not None:
                edits = _patch_edits(cf, *out)
            else:
                assert means is not None
                edits = _mean_edits(means, *out)
            if positions == "end":
                edits = _at_end(edits)
            with model.hooks(edit=edits):
                logits = hf_internals.forward_last(model.hf, input_ids=batch.ref, use_cache=False,
                                                   **batch.inputs()).logits[:, -1]
            sums[i] += _quantity(metric, logits, batch.answer).sum().cpu()
    return (sums / max(len(samples), 1)).tolist(), len(samples)


def faithfulness(model: HookedModel, pairs: str | Path, scores: dict[str, float], absolute: bool = True,
                 ablation: str = "counterfactual", mean: KnockoutMean = DEFAULT_MEAN, metric: str = "logit",
                 limit: int | None = None, batch_size: int = 16, percentages: tuple[float, ...] = PERCENTAGES,
                 progress: bool = True, positions: str = "all") -> Curve:
    """The faithfulness curve of the circuits that keep the highest-scored components (`scores`: component name ->
    score, NaN for unscored) at MIB's sizes."""
    order = ranked(scores, absolute)
    n = sizes(len(order), percentages)
    kept = [order[:k] for k in n]
    distinct = list(dict.fromkeys(frozenset(k) for k in kept))  # the small sizes of a small model coincide
    values, n_items = measure(model, pairs, [None, set(), *distinct], ablation, mean, metric, limit, batch_size,
                              progress, positions)
    m = dict(zip(distinct, values[2:]))
    return Curve.of(values[0], values[1], [m[frozenset(k)] for k in kept], kept,
                    level="node" if positions == "all" else "node at END", ablation=ablation,
                    metric=metric, absolute=absolute, n_items=n_items, n_scored=len(order),
                    percentages=list(percentages), sizes=n)

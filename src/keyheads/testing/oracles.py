"""The slow, direct computations that the tests and the bench scripts check keyheads' fast paths against.

keyheads itself computes knockout accuracies with the batched END-only passes (keyheads.analysis.passes)
and generates with keyheads.evaluation.engine.generate_stream; these are the references: one full forward
pass per knockout set, and generation's results in row order. No pytest here: the bench scripts import
this module too (they put the repository root on sys.path).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from keyheads.analysis.common import Predictions, knockout_subset
from keyheads.analysis.knockout_curves import Curves, CurveSettings, curve_sets, curves_from
from keyheads.evaluation.engine import PrefixKV, generate_stream
from keyheads.heads import Head
from keyheads.knockout import Knockout
from keyheads.models.model import HookedModel


class Batches:
    """Prompts encoded once, in batches of similar length (little padding), reusable across passes."""

    def __init__(self, model: HookedModel, prompts: Sequence[str], batch_size: int = 32):
        self.lengths = [len(model.tokens(p, add_special_tokens=True)) for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: (self.lengths[i], i))
        self.chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        self.encoded = [model.encode([prompts[i] for i in chunk]) for chunk in self.chunks]
        self.n = len(prompts)


@torch.no_grad()
def predict(model: HookedModel, batches: Batches, answer_ids: Sequence[int], edits: dict | None = None,
            topk: int = 0) -> Predictions:
    """One full forward pass over all prompts with `edits` installed; results in prompt order."""
    top1 = torch.empty(batches.n, dtype=torch.long)
    p_ans = torch.empty(batches.n)
    tk_ids = torch.empty(batches.n, topk, dtype=torch.long) if topk else None
    tk_p = torch.empty(batches.n, topk) if topk else None
    answers = torch.as_tensor(list(answer_ids))
    for chunk, batch in zip(batches.chunks, batches.encoded):
        logits, _ = model.run(batch, edit=edits or {})
        probs = logits[:, -1].float().softmax(-1).cpu()
        idx = torch.tensor(chunk)
        top1[idx] = probs.argmax(-1)
        p_ans[idx] = probs.gather(1, answers[idx][:, None])[:, 0]
        if tk_ids is not None and tk_p is not None:  # topk > 0
            p, i = probs.topk(topk, dim=-1)
            tk_ids[idx], tk_p[idx] = i, p
    return Predictions(top1, p_ans, tk_ids, tk_p)


def accuracy_with(model: HookedModel, batches: Batches, answer_ids: Sequence[int], full: Knockout | None,
                  heads: Sequence[Head]) -> float:
    """Top-1 accuracy with `heads` mean-ablated, by one full forward pass."""
    if not heads:
        edits = None
    elif full is None:
        raise ValueError("heads to knock out, but no means were computed")
    else:
        edits = knockout_subset(full, heads).edits()
    return predict(model, batches, answer_ids, edits).accuracy(answer_ids)


def direct_curves(model: HookedModel, batches: Batches, answer_ids: Sequence[int], full: Knockout,
                  ranked: Sequence[Head], candidates: Sequence[Head], cfg: CurveSettings,
                  extra: Sequence[Sequence[Head]] = ()) -> Curves:
    """knockout_curves' curves by one full forward pass per knockout set."""
    sets, orders = curve_sets(ranked, candidates, cfg)
    sets += [list(s) for s in extra]
    accuracies = [accuracy_with(model, batches, answer_ids, full, s) for s in sets]
    return curves_from(accuracies, ranked, orders, cfg, len(extra))


def greedy_generate(model: HookedModel, rows: Sequence[Sequence[int]], max_new_tokens: int,
                    stop: Callable[[str], int | None] | None, prefix: PrefixKV | None = None,
                    batch_size: int | None = None, check_every: int | None = None) -> list[tuple[str, str]]:
    """`generate_stream`'s results in row order."""
    results: list[tuple[str, str]] = [("", "length")] * len(rows)
    for i, result in generate_stream(model, rows, max_new_tokens, stop, prefix, batch_size, check_every):
        results[i] = result
    return results

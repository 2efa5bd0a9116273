"""The batched END-only passes give the numbers of one direct forward pass per knockout set."""
import random

import pytest
import torch

from keyheads.analysis.common import all_heads, knockout_subset
from keyheads.analysis.knockout_curves import CurveSettings, knockout_curves
from keyheads.analysis.passes import EndPasses
from keyheads.knockout import compute_means
from keyheads.models.prompt_set import PromptSet
from keyheads.testing import TINY_FAMILIES, tiny_model
from keyheads.testing.oracles import Batches, direct_curves, predict

PREFIXES = ["1 + 2 = 3\n4 + 4 = 8\n", "Q: 5 plus 2? A: 7\n"]


def prompt_pairs(seed: int = 0, shared: int = 20, loose: int = 7):
    """Prompts with a shared few-shot prefix (two templates, several lengths) plus unrelated ones."""
    rng = random.Random(seed)
    refs, cfs = [], []
    for i in range(shared):
        p = PREFIXES[i % 2]
        a, b = rng.randint(1, 99), rng.randint(1, 9)
        refs.append(f"{p}{a} + {b} = ")
        cfs.append(f"{p}{a} @ {b} = ")
    for i in range(loose):
        t = "".join(rng.choice("abcdefgh ") for _ in range(rng.randint(5, 30)))
        refs.append(f"{t}: {i} + 3 = ")
        cfs.append(f"{t}: {i} @ 3 = ")
    return refs, cfs


def direct(model, refs, answers, full, sets, topk=0):
    batches = Batches(model, refs, 8)
    return [predict(model, batches, answers, knockout_subset(full, s).edits() if s else None, topk=topk)
            for s in sets]


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("mode", ["aligned", "global"])
def test_sets_equal_direct_forward_passes(family, mode):
    model = tiny_model(family, dtype=torch.float64)
    refs, cfs = prompt_pairs()
    heads = all_heads(model)
    # means from shorter prompts than some references: those fall back to the global mean early on
    full = compute_means(model, cfs[:20], heads=heads, mean=mode, progress=False)
    answers = [random.Random(i).randint(4, 60) for i in range(len(refs))]
    sets = [[], [(2, 1)], [(0, 0), (1, 3)], [(1, 2), (2, 0), (2, 3)], heads[:5], heads]
    prompts = PromptSet(model, refs, batch_size=4)
    if family != "gemma3":  # its sliding window (8 tokens here) is shorter than the prefixes
        assert any(g.prefix for g in prompts.groups) and any(g.mask is not None for g in prompts.groups)
    engine = EndPasses(model, prompts, full, max_rows=16)  # several passes of several sets each
    fast = engine.predict(sets, answers, topk=3)
    slow = direct(model, refs, answers, full, sets, topk=3)
    for s, f, d in zip(sets, fast, slow):
        assert torch.equal(f.top1, d.top1), s
        assert torch.equal(f.topk_ids, d.topk_ids), s
        torch.testing.assert_close(f.p_answer, d.p_answer, rtol=0, atol=1e-6)
        torch.testing.assert_close(f.topk_probs, d.topk_probs, rtol=0, atol=1e-6)
    # the sets did change the predictions: the comparison is not between two clean passes
    assert any(not torch.allclose(f.p_answer, fast[0].p_answer) for f in fast[1:])


def test_less_work_than_direct_passes():
    model = tiny_model("llama")
    refs, cfs = prompt_pairs(shared=24, loose=0)
    full = compute_means(model, cfs, heads=all_heads(model), progress=False)
    engine = EndPasses(model, PromptSet(model, refs), full)
    sets = [[(2, h)] for h in range(4)]  # all in the top layer: only one layer to recompute
    engine.predict(sets, [5] * len(refs))
    direct_tokens = sum(len(model.tokens(p, add_special_tokens=True)) for p in refs) * model.n_layers * len(sets)
    assert engine.work.token_layers < direct_tokens / 2


def test_fast_curves_equal_direct_curves():
    model = tiny_model("llama")
    refs, cfs = prompt_pairs(shared=24, loose=4)
    heads = all_heads(model)
    full = compute_means(model, cfs, heads=heads, progress=False)
    answers = model.forward(model.encode(refs))[:, -1].argmax(-1).tolist()
    ranked = [(2, 1), (0, 3), (1, 0), (2, 2), (0, 0)]
    cfg = CurveSettings(k=5, seeds=3, seed=7)
    fast = knockout_curves(model, PromptSet(model, refs), answers, full, ranked, heads, cfg, progress=False,
                           extra=[[(1, 1), (2, 3)]])
    slow = direct_curves(model, Batches(model, refs, 5), answers, full, ranked, heads, cfg, extra=[[(1, 1), (2, 3)]])
    n = len(refs)  # the direct method averages in float32: compare the counts of right answers
    counts = lambda c: [round(a * n) for a in c.effect + sum(c.random, []) + c.extra]  # noqa: E731
    assert counts(fast) == counts(slow)
    assert fast.effect[0] == 1.0 and min(fast.effect) < 1.0

"""keyheads finds the circuits tracr compiled: path patching ranks the compiled on-path heads above every other
head and gives every off-path head (the compiled one the output ignores, and the empty ones) no effect; knocking
out the on-path heads drops accuracy to chance, knocking out as many others changes nothing.

The pairs (pairs.jsonl beside each model, from studies/compile_circuits.py) give each full-length input a
counterfactual that differs at every token and in its answer, so that every head's input changes: an off-path
head's zero effect is then the circuit's doing, not an unchanged input's."""
import collections
import random

import pytest
import torch

from keyheads.data.pairs import read_pairs
from keyheads.knockout import compute_means
from keyheads.patching import IdentifySettings, run_sweep

from .circuits import PROGRAMS, accuracy, circuit, end_logits

# float32 rounding of a patched forward pass, relative to an answer logit of about 1
ZERO = 1e-5


@pytest.mark.parametrize("method", ["path", "activation"])
@pytest.mark.parametrize("name", PROGRAMS)
def test_patching_finds_the_compiled_heads(name, method):
    """Activation patching (total effect) finds every on-path head. Path patching with the logits as receivers
    freezes every later head, so it finds the on-path heads that reach the logits through MLPs alone, and gives
    exactly no effect to one that acts only through a later head's query (countfirst's first head): what the
    method measures, not a miss."""
    c = circuit(name)
    effects, _ = run_sweep(c.model(), c.pairs, IdentifySettings(method=method), batch_size=128, progress=False)
    assert effects.n_excluded == 0
    found = c.on_path if method == "activation" else c.direct
    for head in found:  # swapping in the counterfactual's value changes the answer: the answer logit drops
        assert effects.effect(head) < -0.1, (head, effects.heads)
    for head in c.others() + [h for h in c.on_path if h not in found]:
        assert abs(effects.effect(head)) < ZERO, (head, effects.heads)
    assert set(effects.ranked()[:len(found)]) == set(found)


def chance(rows: list[dict]) -> float:
    """The best accuracy without any head: END sees only its own token, so the best guess is the commonest
    answer among the inputs ending in that token."""
    by_end: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in rows:
        by_end[row["prompt"].split()[-1]][row["answer"]] += 1
    return sum(max(counts.values()) for counts in by_end.values()) / len(rows)


@pytest.mark.parametrize("name", PROGRAMS)
def test_knockout_of_the_on_path_heads_drops_accuracy_to_chance(name):
    c = circuit(name)
    model = c.model()
    counterfactuals = [p.counterfactual for p in read_pairs(c.pairs)]
    assert accuracy(model, c.domain) == 1.0
    knockout = compute_means(model, counterfactuals, heads=c.on_path, progress=False)
    assert accuracy(model, c.domain, edit=knockout.edits()) <= chance(c.domain) + 1e-6


@pytest.mark.parametrize("name", [n for n in PROGRAMS if len(circuit(n).others()) >= len(circuit(n).on_path)])
def test_knockout_of_as_many_other_heads_changes_nothing(name):
    """Every draw of as many off-path heads as there are on-path ones, the compiled off-path head included
    where there is one: the answers, and the END logits to float rounding, stay as they were."""
    c = circuit(name)
    model = c.model()
    counterfactuals = [p.counterfactual for p in read_pairs(c.pairs)]
    prompts = [r["prompt"] for r in c.domain]
    clean = end_logits(model, prompts)
    rng = random.Random(0)
    draws = {tuple(sorted(rng.sample(c.others(), len(c.on_path)))) for _ in range(8)}
    draws |= {tuple(h for h in c.compiled if h not in c.on_path)} - {()}
    for heads in draws:
        knockout = compute_means(model, counterfactuals, heads=list(heads), progress=False)
        assert accuracy(model, c.domain, edit=knockout.edits()) == 1.0, heads
        torch.testing.assert_close(end_logits(model, prompts, edit=knockout.edits()), clean, atol=ZERO, rtol=0)

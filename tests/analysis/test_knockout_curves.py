"""Knockout curves against a direct computation of accuracy with heads mean-ablated by hand."""
import pytest
import torch

from keyheads.analysis.common import all_heads, answer_token, load_samples
from keyheads.analysis.knockout_curves import CurveSettings, knockout_curves, random_order
from keyheads.io import read_json
from keyheads.knockout import compute_means
from keyheads.models.prompt_set import PromptSet

from tests.helpers import make_rows


def direct_accuracy(model, refs, cfs, answers, heads):
    """Replace each head's output by its per-position mean over `cfs` (all the same length) by hand."""
    layers = sorted({l for l, _ in heads})
    _, cache = model.run(model.encode(cfs), capture=[f"{l}.head_out" for l in layers])
    means = {l: cache[f"{l}.head_out"].mean(0) for l in layers}  # [pos, head, dim]

    def edit(layer):
        def fn(z):
            z = z.clone()
            for l, h in heads:
                if l == layer:
                    z[:, :, h] = means[l][:, h]
            return z
        return fn

    logits, _ = model.run(model.encode(refs), edit={f"{l}.head_out": edit(l) for l in layers})
    return (logits[:, -1].argmax(-1) == torch.tensor(answers)).float().mean().item()


def test_curve_points_equal_direct_accuracy(llama):
    rows = make_rows(16)
    refs = [r["reference"] for r in rows]
    cfs = [r["counterfactual"] for r in rows]
    # a random model knows no arithmetic: score it on its own clean predictions, so k=0 is 100%
    clean = llama.forward(llama.encode(refs))[:, -1].argmax(-1).tolist()
    heads = all_heads(llama)
    full = compute_means(llama, cfs, heads=heads, progress=False)
    ranked = [(2, 1), (0, 3), (1, 0), (2, 2), (0, 0)]
    curves = knockout_curves(llama, PromptSet(llama, refs), clean, full, ranked, heads,
                             CurveSettings(k=5, seeds=3, seed=7), progress=False)
    assert curves.ks == [0, 1, 2, 3, 4, 5] and curves.effect[0] == 1.0
    for k in range(1, 6):
        assert abs(curves.effect[k] - direct_accuracy(llama, refs, cfs, clean, ranked[:k])) < 1e-6
    for order, row in zip(curves.random_orders, curves.random):
        for k in (2, 5):
            assert abs(row[k] - direct_accuracy(llama, refs, cfs, clean, order[:k])) < 1e-6
    assert min(curves.effect) < 1.0  # the knockout does something, so equality above is not trivial


def test_random_rank_uses_distinct_heads_and_differs_across_seeds(llama):
    heads = all_heads(llama)
    orders = [random_order(heads, s) for s in range(5)]
    for order in orders:
        assert len(set(order)) == len(heads) == len(order)
    assert len({tuple(o[:3]) for o in orders}) > 1
    assert random_order(heads, 3) == orders[3]  # seeded: reproducible


def test_samples_get_the_answer_token(llama, pairs_file):
    samples = load_samples(llama, pairs_file)
    s = samples[0]
    assert llama.tokenizer.decode([s.answer_id]) == s.answer
    # a prompt without the trailing space gets it back, and the answer is still the digit
    prompt, tok = answer_token(llama, s.prompt.rstrip(), s.answer)
    assert prompt == s.prompt and tok == s.answer_id
    # continuing a number: no space in between
    prompt, tok = answer_token(llama, "from 1723 to 172", "8", join="")
    assert prompt == "from 1723 to 172" and llama.tokenizer.decode([tok]) == "8"


def test_curves_killed_between_chunks_resume_from_the_checkpoint(llama, tmp_path, monkeypatch):
    import keyheads.analysis.knockout_curves as kc

    from tests.helpers import Killed

    rows = make_rows(12)
    refs, cfs = [r["reference"] for r in rows], [r["counterfactual"] for r in rows]
    clean = llama.forward(llama.encode(refs))[:, -1].argmax(-1).tolist()
    heads = all_heads(llama)
    full = compute_means(llama, cfs, heads=heads, progress=False)
    args = (llama, PromptSet(llama, refs, 4), clean, full, [(2, 1), (0, 3), (1, 0)], heads,
            CurveSettings(k=3, seeds=3, seed=1))
    want = knockout_curves(*args, progress=False)  # 1 + 3 + 9 = 13 sets, no checkpoint
    monkeypatch.setattr(kc, "CHUNK", 4)
    real, calls = kc.set_accuracies, []

    def dies_on_the_third_chunk(*a, **k):
        calls.append(len(a[4]))
        if len(calls) == 3:
            raise Killed
        return real(*a, **k)

    monkeypatch.setattr(kc, "set_accuracies", dies_on_the_third_chunk)
    path = tmp_path / "curves.partial.json"
    with pytest.raises(Killed):
        knockout_curves(*args, progress=False, checkpoint=(path, "k1"))
    assert len(read_json(path)["results"]) == 8  # two chunks of 4 kept
    calls.clear()
    monkeypatch.setattr(kc, "set_accuracies", real)
    counted = []
    monkeypatch.setattr(kc, "set_accuracies", lambda *a, **k: counted.append(len(a[4])) or real(*a, **k))
    got = knockout_curves(*args, progress=False, checkpoint=(path, "k1"))
    assert sum(counted) == 13 - 8  # only what the killed run had not finished
    assert (got.effect, got.random) == (want.effect, want.random)
    counted.clear()
    knockout_curves(*args, progress=False, checkpoint=(path, "another key"))  # other inputs: all again
    assert sum(counted) == 13
    for broken in ('{"key": "k1", "accura', '{"key": "k1"}', '[1, 2]'):  # truncated, keys missing, not an object
        path.write_text(broken)
        counted.clear()
        again = knockout_curves(*args, progress=False, checkpoint=(path, "k1"))
        assert sum(counted) == 13 and again.effect == want.effect


def test_head_means_are_kept_until_the_stage_ends(llama, tmp_path, monkeypatch):
    """The stage's means pass runs once: a resumed stage reads the same tensors back; other prompts, other
    batching or a broken file compute them again."""
    import keyheads.analysis.knockout_run as kr

    cfs = [f"{a} + {b} = " for a, b in [(1, 2), (3, 4), (5, 6), (7, 1), (2, 2)]]
    heads = all_heads(llama)
    calls = []
    monkeypatch.setattr(kr, "compute_means", lambda *a, **k: calls.append(1) or compute_means(*a, **k))
    path = tmp_path / kr.MEANS_PARTIAL
    first = kr.cached_means(llama, cfs, heads, "aligned", path, batch_size=2, progress=False)
    want = compute_means(llama, cfs, heads=heads, batch_size=2, progress=False).to_state()
    again = kr.cached_means(llama, cfs, heads, "aligned", path, batch_size=2, progress=False)
    assert len(calls) == 1
    for ko in (first, again):
        state = ko.to_state()
        assert set(state) == set(want) and all(torch.equal(state[k], want[k]) for k in want)
    assert again.heads == first.heads and again.mean == first.mean
    kr.cached_means(llama, cfs[:4], heads, "aligned", path, batch_size=2, progress=False)
    kr.cached_means(llama, cfs[:4], heads, "aligned", path, batch_size=3, progress=False)
    assert len(calls) == 3
    path.write_bytes(path.read_bytes()[:100])  # truncated
    kr.cached_means(llama, cfs, heads, "aligned", path, batch_size=2, progress=False)
    assert len(calls) == 4

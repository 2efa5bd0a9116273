"""The fast path patching equals the naive one (one forward per sender), and the other
methods equal their direct definitions."""
import itertools
import random

import pytest
import torch

from keyheads.patching.activation import activation_patch_batch
from keyheads.patching.attribution import attribution_patch_batch, integrated_patch_batch
from keyheads.patching.naive import naive_path_patch_batch
from keyheads.patching.path import path_patch_batch
from keyheads.patching.samples import Batch, PatchSample, _cuts, batches
from keyheads.testing import TINY_FAMILIES, tiny_model

pytestmark = pytest.mark.slow  # every patching method on every family, about 100 s

REF = ["3 + 4 = ", "5 + 2 = ", "1 + 1 = "]
CF = ["3 @ 4 = ", "5 < 2 = ", "1 > 1 = "]


def tiny_batch(model):
    return Batch([0, 1, 2], model.encode(REF).input_ids, model.encode(CF).input_ids, torch.tensor([10, 11, 6]))


@pytest.fixture(scope="module", params=TINY_FAMILIES)
def model(request):
    return tiny_model(request.param)


@pytest.mark.parametrize("metric", ["relative-logit", "logit-diff", "prob"])
def test_fast_path_patching_matches_naive(model, metric):
    batch = tiny_batch(model)
    fast = path_patch_batch(model, batch, metric)
    naive = naive_path_patch_batch(model, batch, metric)
    torch.testing.assert_close(fast.original, naive.original, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.heads, naive.heads, atol=1e-4, rtol=0)
    torch.testing.assert_close(fast.mlps, naive.mlps, atol=1e-4, rtol=0)
    if metric == "prob":  # tiny random models give tiny probabilities: compare relatively too
        rel = (fast.heads - naive.heads).abs() / naive.heads.abs().clamp(min=1e-12)
        assert rel.max() < 1e-3
    # guard: the effects are not all zero, so agreement means something
    assert ((naive.heads - naive.original[:, None, None]) / naive.original[:, None, None]).abs().max() > 1e-2


def test_path_patching_differs_from_total_effect(model):
    """Freezing the heads above the sender matters: path != activation patching somewhere."""
    batch = tiny_batch(model)
    path = path_patch_batch(model, batch, "logit-diff")
    total = activation_patch_batch(model, batch, "logit-diff")
    assert (path.heads[:, :-1] - total.heads[:, :-1]).abs().max() > 1e-4
    # in the last layer no head lies above the sender: both definitions agree
    torch.testing.assert_close(path.heads[:, -1], total.heads[:, -1], atol=1e-4, rtol=0)


def test_activation_patching_matches_full_forward(model):
    batch = tiny_batch(model)
    got = activation_patch_batch(model, batch, "logit-diff")
    _, cf = model.run(batch.cf, capture=[f"{l}.head_out" for l in range(model.n_layers)]
                      + [f"{l}.mlp_write" for l in range(model.n_layers)])
    for layer in range(model.n_layers):
        for head in range(model.n_heads):
            def edit(z, layer=layer, head=head):
                z = z.clone()
                z[:, -1, head] = cf[f"{layer}.head_out"][:, -1, head]
                return z
            logits, _ = model.run(batch.ref, edit={f"{layer}.head_out": edit})
            want = logits[:, -1].gather(1, batch.answer[:, None])[:, 0]
            torch.testing.assert_close(got.heads[:, layer, head], want, atol=1e-4, rtol=0)

        def mlp_edit(x, layer=layer):
            x = x.clone()
            x[:, -1] = cf[f"{layer}.mlp_write"][:, -1]
            return x
        logits, _ = model.run(batch.ref, edit={f"{layer}.mlp_write": mlp_edit})
        torch.testing.assert_close(got.mlps[:, layer], logits[:, -1].gather(1, batch.answer[:, None])[:, 0],
                                   atol=1e-4, rtol=0)


def test_attribution_is_the_directional_derivative_of_path_patching(model):
    """grad . delta equals a finite difference of the frozen-heads forward pass."""
    batch = tiny_batch(model)
    est = attribution_patch_batch(model, batch, "logit-diff")
    L = model.n_layers
    _, ref = model.run(batch.ref, capture=[f"{l}.head_out" for l in range(L)])
    _, cf = model.run(batch.cf, capture=[f"{l}.head_out" for l in range(L)])
    eps = 1e-2
    for layer, head in [(0, 1), (L - 2, 3), (L - 1, 0)]:
        def frozen(scale, layer=layer, head=head):
            edits = {}
            for l in range(L):
                def edit(z, l=l):
                    z = ref[f"{l}.head_out"].clone()
                    if l == layer:
                        d = cf[f"{l}.head_out"][:, -1, head] - ref[f"{l}.head_out"][:, -1, head]
                        z[:, -1, head] += scale * d
                    return z
                edits[f"{l}.head_out"] = edit
            logits, _ = model.run(batch.ref, edit=edits)
            return logits[:, -1].gather(1, batch.answer[:, None])[:, 0].double()
        fd = (frozen(eps) - frozen(-eps)) / (2 * eps)
        torch.testing.assert_close(est.heads[:, layer, head].double() - est.original.double(), fd, atol=2e-3, rtol=2e-2)


def test_integrated_attribution_is_the_mean_directional_derivative_along_the_input_line(model):
    """attribution-ig's estimate: at each of the steps' inputs (embeddings k/steps of the way from the counterfactual
    to the reference), a finite difference of the frozen-heads forward pass along the END difference, averaged."""
    batch, steps = tiny_batch(model), 3
    est = integrated_patch_batch(model, batch, "logit-diff", steps=steps)
    L = model.n_layers
    points = [f"{l}.head_out" for l in range(L)]
    _, ref = model.run(batch.ref, capture=points)
    _, cf = model.run(batch.cf, capture=points)
    embed = model.hf.get_input_embeddings()
    with torch.no_grad():
        e_ref, e_cf = embed(batch.ref), embed(batch.cf)
    eps = 1e-2
    for layer, head in [(0, 1), (L - 2, 3), (L - 1, 0)]:
        fds = []
        for k in range(1, steps + 1):
            e = e_cf + (k / steps) * (e_ref - e_cf)
            with torch.no_grad(), model.hooks(capture=points) as at:
                model.hf(inputs_embeds=e, use_cache=False)

            def frozen(scale, layer=layer, head=head, at=at, e=e):
                edits = {}
                for l in range(L):
                    def edit(z, l=l):
                        z = at[f"{l}.head_out"].clone()
                        if l == layer:
                            d = cf[f"{l}.head_out"][:, -1, head] - ref[f"{l}.head_out"][:, -1, head]
                            z[:, -1, head] += scale * d
                        return z
                    edits[f"{l}.head_out"] = edit
                with torch.no_grad(), model.hooks(edit=edits):
                    logits = model.hf(inputs_embeds=e, use_cache=False).logits
                return logits[:, -1].gather(1, batch.answer[:, None])[:, 0].double()
            fds.append((frozen(eps) - frozen(-eps)) / (2 * eps))
        want = torch.stack(fds).mean(0)
        torch.testing.assert_close(est.heads[:, layer, head].double() - est.original.double(), want, atol=2e-3,
                                   rtol=2e-2)
    # one step is the reference itself: plain attribution
    one = integrated_patch_batch(model, batch, "logit-diff", steps=1)
    torch.testing.assert_close(one.heads, attribution_patch_batch(model, batch, "logit-diff").heads)


def test_batches_of_different_lengths_and_one_sample(model):
    one = Batch([0], model.encode(REF[:1]).input_ids, model.encode(CF[:1]).input_ids, torch.tensor([10]))
    torch.testing.assert_close(path_patch_batch(model, one, "prob").heads,
                               path_patch_batch(model, tiny_batch(model), "prob").heads[:1], atol=1e-5, rtol=0)


def test_nan_names_the_layer():
    model = tiny_model("llama")
    with torch.no_grad():
        model.layer_module(1, "mlp.down_proj").weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="layer 1"):
        path_patch_batch(model, tiny_batch(model), "relative-logit")


@pytest.mark.real_model
def test_fast_matches_naive_on_smollm2(smollm2):
    prefix = "1 + 2 = 3\n4 + 4 = 8\n6 + 1 = 7\n"
    ref = smollm2.encode([prefix + "5 + 3 = ", prefix + "2 + 4 = "]).input_ids
    cf = smollm2.encode([prefix + "5 @ 3 = ", prefix + "2 < 4 = "]).input_ids
    answer = torch.tensor([smollm2.tokens("8")[0], smollm2.tokens("6")[0]])
    batch = Batch([0, 1], ref, cf, answer)
    fast = path_patch_batch(smollm2, batch, "relative-logit")
    layers = [0, 15, 29]  # spot checks across depth (first, middle, last) keep the naive loop affordable
    naive = naive_path_patch_batch(smollm2, batch, "relative-logit", layers=layers)
    torch.testing.assert_close(fast.heads[:, layers], naive.heads[:, layers], atol=1e-4, rtol=0)
    torch.testing.assert_close(fast.mlps[:, layers], naive.mlps[:, layers], atol=1e-4, rtol=0)
    naive = naive.heads[:, layers]
    effects = (fast.heads - fast.original[:, None, None]) / fast.original[:, None, None]
    assert effects.min() < -0.01  # some head matters on the real model


MIXED = [("Q: 5 + 2? A: ", "Q: 5 @ 2? A: ", 7), ("3 + 4 = ", "3 @ 4 = ", 10), ("12 + 1 = ", "12 < 1 = ", 9),
         ("what is 1 + 1? ", "what is 1 > 1? ", 6), ("2+6=", "2#6=", 12)]


def mixed_samples(model):
    tok = model.tokenizer
    return [PatchSample(i, tok(r)["input_ids"], tok(c)["input_ids"], a) for i, (r, c, a) in enumerate(MIXED)]


@pytest.mark.parametrize("method", [path_patch_batch, naive_path_patch_batch, activation_patch_batch,
                                    attribution_patch_batch, integrated_patch_batch],
                         ids=["path", "naive", "activation", "attribution", "attribution-ig"])
def test_left_padded_batches_match_one_sample_batches(model, method):
    samples = mixed_samples(model)
    (batch,) = batches(samples, batch_size=len(samples), device=model.device, pad_id=5)
    assert batch.mask is not None and len({len(s.ref_ids) for s in samples}) == len(samples)
    assert (batch.mask.sum(1).tolist() == [len(samples[i].ref_ids) for i in batch.index])
    assert len(batch.by_length()) > 1  # the fast method's capture takes several passes here
    padded = method(model, batch, "logit-diff")
    for row, i in enumerate(batch.index):
        s = samples[i]
        one = method(
            model,
            Batch([i], torch.tensor([s.ref_ids]), torch.tensor([s.cf_ids]), torch.tensor([s.answer_id])),
            "logit-diff",
        )
        torch.testing.assert_close(padded.original[row], one.original[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(padded.heads[row], one.heads[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(padded.mlps[row], one.mlps[0], atol=1e-5, rtol=0)
    # guard: the padding would change the answer if the mask were ignored
    unmasked = method(model, Batch(batch.index, batch.ref, batch.cf, batch.answer), "logit-diff")
    assert (unmasked.heads - padded.heads).abs().max() > 1e-3


def test_batches_are_sorted_by_length_and_padded_on_the_left():
    model = tiny_model("llama")
    samples = mixed_samples(model)
    got = list(batches(samples, batch_size=2, device="cpu", pad_id=0))
    lengths = [len(s.ref_ids) for s in samples]
    assert [i for b in got for i in b.index] == sorted(range(len(samples)), key=lambda i: lengths[i])
    for b in got:
        width = b.ref.shape[1]
        assert width == max(lengths[i] for i in b.index)
        for row, i in enumerate(b.index):
            pad = width - lengths[i]
            assert b.ref[row, pad:].tolist() == samples[i].ref_ids and b.cf[row, pad:].tolist() == samples[i].cf_ids
            assert (b.ref[row, :pad] == 0).all()
            if b.mask is not None:
                assert b.mask[row].tolist() == [0] * pad + [1] * lengths[i]
            else:
                assert pad == 0
    # samples of one length need no mask: the model keeps its unpadded path
    (same,) = batches([samples[1], samples[1]], batch_size=2, device="cpu")
    assert same.mask is None and same.inputs() == {}


def _padding(lengths, cuts):
    return sum((j - i) * lengths[j - 1] - sum(lengths[i:j]) for i, j in zip(cuts, cuts[1:]))


def _every_cut(n, max_size):
    for k in range(n):
        for inner in itertools.combinations(range(1, n), k):
            cuts = [0, *inner, n]
            if all(0 < j - i <= max_size for i, j in zip(cuts, cuts[1:])):
                yield cuts


def test_batch_cuts_pad_least_against_every_possible_cut():
    rng = random.Random(0)
    for _ in range(60):
        n, size = rng.randint(1, 9), rng.randint(1, 5)
        lengths = sorted(rng.choice([3, 4, 9, 10, 30]) for _ in range(n))
        fewest = -(-n // size)
        got = _cuts(lengths, size, groups=fewest)
        options = [c for c in _every_cut(n, size) if len(c) - 1 == fewest]
        assert got in options
        assert _padding(lengths, got) == min(_padding(lengths, c) for c in options)
        # free number of groups, each costing `group_cost` padded positions
        cost = rng.choice([0, 2, 5, 100])
        got = _cuts(lengths, size, group_cost=cost)
        total = lambda c, lengths=lengths, cost=cost: _padding(lengths, c) + cost * (len(c) - 1)  # noqa: E731
        assert total(got) == min(total(c) for c in _every_cut(n, size))


def test_batches_cut_where_lengths_jump():
    # cutting every 3 rows would pad two 4-token rows to 20; the same two batches can pad none
    lengths = [4, 4, 20, 20, 20, 20]
    samples = [PatchSample(i, [7] * n, [8] * n, 1) for i, n in enumerate(lengths)]
    got = list(batches(samples, batch_size=4, device="cpu"))
    assert [b.index for b in got] == [[0, 1], [2, 3, 4, 5]]
    assert all(b.mask is None for b in got)
    with pytest.raises(ValueError, match="batch_size"):
        list(batches(samples, batch_size=0, device="cpu"))


def test_by_length_splits_a_batch_into_runs_trimmed_to_their_own_width():
    lengths = [3, 3, 4, 12, 12]
    samples = [PatchSample(i, list(range(1, n + 1)), list(range(11, n + 11)), i) for i, n in enumerate(lengths)]
    (batch,) = batches(samples, batch_size=5, device="cpu", pad_id=0)
    parts = batch.by_length(pass_share=0.1)
    assert [p.index for p in parts] == [[0, 1, 2], [3, 4]]
    for part in parts:
        for row, i in enumerate(part.index):
            pad = part.ref.shape[1] - lengths[i]
            assert (
                part.ref[row, pad:].tolist() == samples[i].ref_ids and part.cf[row, pad:].tolist() == samples[i].cf_ids
            )
            assert part.answer[row] == samples[i].answer_id
        assert part.ref.shape[1] == max(lengths[i] for i in part.index)
    assert parts[0].mask.tolist() == [[0, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]]
    assert parts[1].mask is None  # rows of one length take the unmasked path
    # a split that saves little is not worth another pass
    (whole,) = batch.by_length(pass_share=1.0)
    assert whole is batch

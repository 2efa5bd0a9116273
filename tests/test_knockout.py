"""Mean ablation against a direct computation."""
import pytest
import torch

from keyheads.heads import parse_heads
from keyheads.knockout import Knockout, compute_means
from keyheads.testing import tiny_model

CF = ["3 @ 4 = ", "5 < 2 = ", "7 > 1 = ", "2 # 9 = "]
REF = ["3 + 4 = ", "6 + 2 = "]


@pytest.fixture(scope="module", params=["llama", "gemma3", "gpt2"])
def model(request):
    return tiny_model(request.param)


def test_all_heads_equals_attention_output_replaced_by_its_mean(model):
    heads = [(l, h) for l in range(model.n_layers) for h in range(model.n_heads)]
    ko = compute_means(model, CF, heads=heads, progress=False)
    got, _ = model.run(model.encode(REF), edit=ko.edits())
    # direct: the mean over the counterfactual prompts of each layer's attention output, per position
    _, cache = model.run(model.encode(CF), capture=[f"{l}.attn_out" for l in range(model.n_layers)])
    means = {l: cache[f"{l}.attn_out"].mean(0) for l in range(model.n_layers)}
    want, _ = model.run(model.encode(REF), edit={f"{l}.attn_out": (lambda x, m=m: m.expand_as(x).clone())
                                                  for l, m in means.items()})
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert not ko.fallback_used
    clean = model.forward(model.encode(REF))
    assert (clean - got).abs().max() > 1e-3


def test_one_head_only_touches_that_head(model):
    ko = compute_means(model, CF, heads=[(1, 2)], progress=False)
    _, base = model.run(model.encode(REF), capture=["1.head_out"])
    with model.hooks(capture=["1.head_out"], edit=ko.edits()) as cache:
        model.forward(model.encode(REF))
    z, z0 = cache["1.head_out"], base["1.head_out"]
    keep = [h for h in range(model.n_heads) if h != 2]
    torch.testing.assert_close(z[:, :, keep], z0[:, :, keep], atol=0, rtol=0)
    _, cf = model.run(model.encode(CF), capture=["1.head_out"])
    torch.testing.assert_close(z[0, :, 2], cf["1.head_out"][:, :, 2].mean(0), atol=1e-5, rtol=0)


def test_mlp_knockout_equals_direct_replacement(model):
    ko = compute_means(model, CF, mlps=[0, 2], progress=False)
    got, _ = model.run(model.encode(REF), edit=ko.edits())
    _, cache = model.run(model.encode(CF), capture=["0.mlp_write", "2.mlp_write"])

    def mean_of(v):
        m = v.mean(0)
        return lambda x: m.expand_as(x).clone()

    want, _ = model.run(model.encode(REF), edit={k: mean_of(v) for k, v in cache.items()})
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_longer_input_uses_global_fallback_and_says_so(model):
    ko = compute_means(model, CF, heads=[(0, 0)], progress=False)
    model.run(model.encode(REF), edit=ko.edits())
    assert not ko.fallback_used
    model.run(model.encode(["Q: what is 3 plus 4? A: "]), edit=ko.edits())
    assert ko.fallback_used


def test_state_roundtrip(model):
    ko = compute_means(model, CF, heads=[(0, 1), (2, 3)], mlps=[1], progress=False)
    again = Knockout.from_state(ko.heads, ko.mlps, ko.to_state())
    a, _ = model.run(model.encode(REF), edit=ko.edits())
    b, _ = model.run(model.encode(REF), edit=again.edits())
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_bad_components_are_explained(model):
    with pytest.raises(ValueError, match="LAYER.HEAD"):
        parse_heads("12-3")
    with pytest.raises(ValueError, match="does not exist"):
        compute_means(model, CF, heads=[(0, 99)], progress=False)
    with pytest.raises(ValueError, match="at least one"):
        compute_means(model, [], heads=[(0, 0)], progress=False)

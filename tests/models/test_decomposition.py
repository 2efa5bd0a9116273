"""The access points decompose the forward pass exactly, for every supported family."""
import pytest
import torch

from keyheads.testing import TINY_FAMILIES, tiny_model

PROMPTS = ["12 + 34 = ", "7 plus 8 is", "Q: What is 3 times 4? A:"]


@pytest.fixture(scope="module", params=TINY_FAMILIES)
def model(request):
    return tiny_model(request.param)


def _points(model):
    names = ["resid_pre", "head_out", "attn_out", "attn_write", "mlp_in", "mlp_out", "mlp_write", "resid_post"]
    if not model.parallel_residual:
        names.append("resid_mid")
    return [f"{layer}.{name}" for layer in range(model.n_layers) for name in names] + ["final_norm"]


def test_heads_sum_to_attention_output(model):
    batch = model.encode(PROMPTS)
    _, cache = model.run(batch, capture=[f"{l}.{p}" for l in range(model.n_layers) for p in ("head_out", "attn_out")])
    for layer in range(model.n_layers):
        heads = cache[f"{layer}.head_out"]
        assert heads.shape == (*batch.input_ids.shape, model.n_heads, model.head_dim)
        per_head = model.out_proj_heads(layer, heads)
        total = per_head.sum(-2)
        bias = model.out_proj_bias(layer)
        if bias is not None:
            total = total + bias
        torch.testing.assert_close(total, cache[f"{layer}.attn_out"], atol=1e-5, rtol=0)


def test_residual_stream_adds_up(model):
    batch = model.encode(PROMPTS)
    _, c = model.run(batch, capture=_points(model))
    for layer in range(model.n_layers):
        pre, post = c[f"{layer}.resid_pre"], c[f"{layer}.resid_post"]
        torch.testing.assert_close(post, pre + c[f"{layer}.attn_write"] + c[f"{layer}.mlp_write"], atol=1e-5, rtol=0)
        mlp_reads = pre if model.parallel_residual else c[f"{layer}.resid_mid"]
        torch.testing.assert_close(model.mlp_write(layer, mlp_reads), c[f"{layer}.mlp_write"], atol=1e-5, rtol=0)
        torch.testing.assert_close(model.attn_write_from_out(layer, c[f"{layer}.attn_out"]), c[f"{layer}.attn_write"],
                                   atol=1e-5, rtol=0)
        if layer + 1 < model.n_layers:
            torch.testing.assert_close(c[f"{layer + 1}.resid_pre"], post, atol=0, rtol=0)


def test_unembed_matches_logits(model):
    batch = model.encode(PROMPTS)
    logits, c = model.run(batch, capture=[f"{model.n_layers - 1}.resid_post"])
    resid = c[f"{model.n_layers - 1}.resid_post"][:, -1]
    torch.testing.assert_close(model.unembed(resid), logits[:, -1], atol=1e-5, rtol=0)
    tokens = torch.tensor([3, 5, 7])
    torch.testing.assert_close(model.unembed(resid, tokens), logits[:, -1].gather(1, tokens[:, None])[:, 0],
                               atol=1e-5, rtol=0)


def test_writing_back_captures_changes_nothing(model):
    batch = model.encode(PROMPTS)
    points = _points(model)
    clean, cache = model.run(batch, capture=points)
    edits = {p: (lambda x, v=cache[p]: v.clone()) for p in points}
    patched, _ = model.run(batch, edit=edits)
    torch.testing.assert_close(patched, clean, atol=1e-5, rtol=0)


def test_edit_changes_output(model):
    """The guard for the test above: an edit that does change a value changes the logits."""
    batch = model.encode(PROMPTS)
    clean, _ = model.run(batch)
    edited, _ = model.run(batch, edit={"1.head_out": lambda x: x * 0})
    assert (edited - clean).abs().max() > 1e-3


def test_attention_patterns_need_eager_and_are_distributions(model):
    batch = model.encode(PROMPTS)
    before = model.hf.config._attn_implementation
    with model.eager_attention():
        _, c = model.run(batch, capture=["0.pattern", "2.pattern"])
    pattern = c["2.pattern"]
    n = batch.input_ids.shape[1]
    assert pattern.shape == (len(PROMPTS), model.n_heads, n, n)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(len(PROMPTS), model.n_heads, n), atol=1e-5, rtol=0)
    longest = 2  # the unpadded prompt: its first query sees only itself
    assert pattern[longest, :, 0, 1:].abs().max() == 0
    assert pattern[longest].triu(1).abs().max() == 0  # causal
    assert model.hf.config._attn_implementation == before


def test_left_padding_gives_same_end_logits(model):
    one = model.forward(model.encode([PROMPTS[0]]))[0, -1]
    batched = model.forward(model.encode(PROMPTS))[0, -1]
    torch.testing.assert_close(batched, one, atol=1e-4, rtol=0)


def test_bad_point_names_are_explained(model):
    with pytest.raises(KeyError, match="unknown hook point"):
        model.run(model.encode(["1"]), capture=["0.nonsense"])
    with pytest.raises(IndexError, match="layers"):
        model.run(model.encode(["1"]), capture=[f"{model.n_layers}.head_out"])

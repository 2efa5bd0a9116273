"""Attention to a shared prefix held once per group, against the full forward of every row."""
import pytest
import torch

from keyheads.models.shared_prefix import SPLIT_UP_TO, SharedPrefix, attend_shared, supports
from keyheads.testing import tiny_model

G, M, P = 2, 3, 7  # groups, rows per group, prefix length
OWN = [5, SPLIT_UP_TO + 4]  # own tokens: attention split in two, or over the concatenation (a long prefill)


def _direct(model, prefixes, own):
    """Logits of every row's own tokens when the row is run whole, prefix included."""
    full = torch.cat([prefixes.repeat_interleave(M, 0), own], 1)
    with torch.no_grad():
        return model.hf(input_ids=full).logits[:, P:]


@pytest.mark.parametrize("S", OWN)
@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2", "gpt_neox"])
def test_rows_attending_a_shared_prefix_get_the_logits_of_whole_rows(family, S):
    model = tiny_model(family, seed=1)
    g = torch.Generator().manual_seed(0)
    V = model.hf.config.vocab_size
    prefixes, own = torch.randint(0, V, (G, P), generator=g), torch.randint(0, V, (G * M, S), generator=g)
    with torch.no_grad():
        shared = SharedPrefix.from_cache(model.hf(input_ids=prefixes, use_cache=True).past_key_values)
        with attend_shared(model, shared):
            out = model.hf(input_ids=own, position_ids=torch.arange(P, P + S).expand(G * M, S), use_cache=True)
    torch.testing.assert_close(out.logits, _direct(model, prefixes, own), atol=1e-4, rtol=0)
    # a decode step on the cache of the rows' own tokens
    nxt = torch.randint(0, V, (G * M, 1), generator=g)
    with torch.no_grad(), attend_shared(model, shared):
        step = model.hf(input_ids=nxt, position_ids=torch.full((G * M, 1), P + S), past_key_values=out.past_key_values,
                        use_cache=True)
    want = _direct(model, prefixes, torch.cat([own, nxt], 1))[:, -1]
    torch.testing.assert_close(step.logits[:, -1], want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("S", OWN)
def test_left_padded_rows_see_the_prefix_and_their_own_tokens_only(S):
    model = tiny_model("llama", seed=2)
    V = model.hf.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, V, (1, P), generator=g)
    rows = [torch.randint(0, V, (n,), generator=g).tolist() for n in (2, S)]
    ids = torch.tensor([[0] * (S - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (S - len(r)) + [1] * len(r) for r in rows])
    pos = P + (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        shared = SharedPrefix.from_cache(model.hf(input_ids=prefix, use_cache=True).past_key_values)
        with attend_shared(model, shared):
            got = model.hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
        want = [model.hf(input_ids=torch.tensor([prefix[0].tolist() + r])).logits[0, -1] for r in rows]
    torch.testing.assert_close(got, torch.stack(want), atol=1e-4, rtol=0)


def test_outside_the_context_attention_is_transformers_own():
    model = tiny_model("llama", seed=2)
    ids = torch.randint(0, model.hf.config.vocab_size, (2, 6))
    with torch.no_grad():
        before = model.hf(input_ids=ids).logits
        shared = SharedPrefix.from_cache(model.hf(input_ids=ids[:1, :3], use_cache=True).past_key_values)
        with attend_shared(model, shared):
            pass
        assert model.hf.config._attn_implementation == "sdpa"
        torch.testing.assert_close(model.hf(input_ids=ids).logits, before, atol=0, rtol=0)


def test_sliding_window_models_are_not_split():
    assert not supports(tiny_model("gemma3"))
    assert supports(tiny_model("llama"))

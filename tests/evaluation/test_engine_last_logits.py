"""Prefill unembeds the last position only, and its logits still equal a full forward's."""
import pytest
import torch

from keyheads.evaluation.engine import PrefixKV, prefill
from keyheads.models import hf_internals
from keyheads.testing import tiny_model
from keyheads.testing.oracles import greedy_generate

SHOTS = "3+4=7\n1+1=2\n6+2=8\n5+4=9\n2+5=7\n"
PROMPTS = [SHOTS + "3+3=", SHOTS + "12+5=", SHOTS + "9+99=", SHOTS + "4+0="]


def _rows(model, prompts):
    return [model.tokenizer(p)["input_ids"] for p in prompts]


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
@pytest.mark.parametrize("shared", [False, True])
def test_prefill_unembeds_one_position_and_matches_a_full_forward(family, shared):
    model = tiny_model(family, seed=2)
    rows = _rows(model, PROMPTS)
    seen = []
    handle = model.hf.get_output_embeddings().register_forward_hook(lambda m, a, out: seen.append(out.shape[1]))
    try:
        step = prefill(model, rows, PrefixKV(model, min_len=4) if shared else None)
    finally:
        handle.remove()
    if hf_internals.last_logits_only(model.hf):
        assert seen and all(n == 1 for n in seen)  # the prefix's pass too: never batch x positions x vocabulary
    # each row on its own, every position unembedded: the last one is the same
    want = torch.stack([model.forward(torch.tensor([r]))[0, -1] for r in rows])
    torch.testing.assert_close(step.logits, want, atol=1e-4, rtol=0)


def test_generation_is_the_same_with_full_logits(monkeypatch):
    model = tiny_model("llama", seed=3)
    rows = _rows(model, PROMPTS)
    fast = greedy_generate(model, rows, 12, lambda text: None, PrefixKV(model, min_len=4))
    monkeypatch.setattr(hf_internals, "last_logits_only", lambda hf: {})
    full = greedy_generate(model, rows, 12, lambda text: None, PrefixKV(model, min_len=4))
    assert fast == full

"""HookedModel.grouped_attention: masked SDPA on grouped key/value heads without copies, same numbers."""
import os

import pytest
import torch
from transformers.integrations import sdpa_attention

from keyheads.models.hf_internals import FORCE_GQA as _FORCE_GQA
from keyheads.testing import tiny_model


@pytest.fixture
def copies(monkeypatch):
    """Counts transformers' key/value head copies (repeat_kv)."""
    calls = []
    original = sdpa_attention.repeat_kv

    def counted(x, n_rep):
        calls.append(n_rep)
        return original(x, n_rep)

    monkeypatch.setattr(sdpa_attention, "repeat_kv", counted)
    return calls


def padded_batch(model):
    ids = torch.randint(5, model.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[1, :2] = 0
    return dict(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))


def test_grouped_attention_skips_key_value_copies_and_keeps_the_numbers(copies, monkeypatch):
    monkeypatch.delenv(_FORCE_GQA, raising=False)
    model = tiny_model("llama")
    assert model.n_kv_heads < model.n_heads
    batch = padded_batch(model)
    with torch.no_grad():
        plain = model.hf(**batch).logits
        assert copies  # a masked pass copies the grouped heads by default
        copies.clear()
        with model.grouped_attention():
            assert os.environ[_FORCE_GQA] == "1"
            grouped = model.hf(**batch).logits
        assert not copies
    assert _FORCE_GQA not in os.environ
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(grouped[real], plain[real], atol=1e-5, rtol=0)


def test_grouped_attention_leaves_a_users_own_setting(monkeypatch):
    monkeypatch.setenv(_FORCE_GQA, "0")
    model = tiny_model("llama")
    with model.grouped_attention():
        assert os.environ[_FORCE_GQA] == "0"
    assert os.environ[_FORCE_GQA] == "0"

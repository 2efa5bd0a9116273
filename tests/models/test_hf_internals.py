"""Each transformers behaviour that keyheads.models.hf_internals relies on, checked against the plain
transformers computation on the tiny models. A transformers upgrade that changes one fails here.

The SDPA switch's effect on the numbers is also checked by test_grouped_attention.py.
"""
import os

import pytest
import torch
from transformers import AutoConfig
from transformers.cache_utils import DynamicLayer
from transformers.integrations import sdpa_attention

from keyheads.models import hf_internals
from keyheads.testing import TINY_FAMILIES, tiny_model

SHOTS = "3+4=7\n1+1=2\n6+2=8\n"


def ids_of(model, *texts):
    return [model.tokenizer(t)["input_ids"] for t in texts]


def full_logits(model, rows):
    """Every row on its own, every position unembedded: the plain transformers computation."""
    with torch.no_grad():
        return [model.hf(input_ids=torch.tensor([r])).logits[0] for r in rows]


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama", dtype=torch.float64)


# ---- logits_to_keep and the body without unembedding ----------------------------------------

@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_logits_to_keep_unembeds_the_last_position_only(family):
    model = tiny_model(family, dtype=torch.float64)
    assert hf_internals.last_logits_only(model.hf) == {"logits_to_keep": 1}  # every family takes it
    row = ids_of(model, SHOTS + "2+2=")[0]
    with torch.no_grad():
        out = hf_internals.forward_last(model.hf, input_ids=torch.tensor([row]))
    assert out.logits.shape == (1, 1, model.config.vocab_size)
    torch.testing.assert_close(out.logits[0, -1], full_logits(model, [row])[0][-1], atol=1e-10, rtol=0)


def test_a_forward_without_logits_to_keep_gets_no_such_argument():
    class Plain(torch.nn.Module):
        def forward(self, input_ids):
            return input_ids

    assert hf_internals.last_logits_only(Plain()) == {}


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_the_body_runs_every_layer_and_the_final_norm_without_the_head(family):
    model = tiny_model(family, dtype=torch.float64)
    ids = torch.tensor(ids_of(model, "12+5="))
    seen = []
    handle = model.hf.get_output_embeddings().register_forward_hook(lambda *a: seen.append(1))
    try:
        with torch.no_grad(), model.hooks(capture=["final_norm", f"{model.n_layers - 1}.resid_post"]) as body:
            assert hf_internals.forward_body(model.hf, input_ids=ids)
        assert not seen  # no unembedding
        with torch.no_grad(), model.hooks(capture=["final_norm", f"{model.n_layers - 1}.resid_post"]) as full:
            logits = model.hf(input_ids=ids).logits
    finally:
        handle.remove()
    assert body.keys() == full.keys()
    for key in full:
        torch.testing.assert_close(body[key], full[key], atol=0, rtol=0)
    assert logits.shape[1] == ids.shape[1]


# ---- cache layers ---------------------------------------------------------------------------

def prefix_cache(model, prefix):
    with torch.no_grad():
        return model.hf(input_ids=torch.tensor([prefix]), use_cache=True).past_key_values


def continue_from(model, cache, rows, start):
    """Logits [rows, vocab] at the last position of `rows` run after a cache of `start` positions."""
    ids = torch.tensor(rows)
    n = ids.shape[1]
    with torch.no_grad():
        out = model.hf(input_ids=ids, past_key_values=cache, use_cache=True,
                       attention_mask=torch.ones(len(rows), start + n, dtype=torch.long),
                       position_ids=torch.arange(start, start + n).expand(len(rows), n))
    return out.logits[:, -1], out.past_key_values


def test_a_forward_cache_is_made_of_dynamic_layers_with_keys_and_values(llama):
    row = ids_of(llama, SHOTS)[0]
    cache = prefix_cache(llama, row)
    assert len(cache.layers) == llama.n_layers
    for layer in cache.layers:
        assert type(layer) is DynamicLayer and layer.is_initialized
        assert layer.keys.shape == (1, llama.n_kv_heads, len(row), llama.head_dim)
        assert layer.values.shape == (1, llama.n_kv_heads, len(row), llama.head_dim)
    assert not any(layer.is_sliding for layer in cache.layers)


def test_sliding_window_layers_are_seen():
    model = tiny_model("gemma3")
    cache = prefix_cache(model, ids_of(model, SHOTS)[0])
    assert [layer.is_sliding for layer in cache.layers] == [True, False, True]  # tiny.py's layer_types
    hf_internals.make_growing(cache, room=4)  # a sliding layer drops positions: it stays what it is
    assert [type(layer) is hf_internals.GrowingLayer for layer in cache.layers] == [False, True, False]
    assert not hf_internals.can_merge(cache)  # so rows join its batch only when the batch is empty


def test_growing_layers_generate_what_plain_layers_do(llama):
    rows = ids_of(llama, SHOTS + "3+3=", SHOTS + "1+2=")
    with torch.no_grad():
        out = llama.hf(input_ids=torch.tensor(rows), use_cache=True)
    plain = out.past_key_values
    with torch.no_grad():  # a second, independent cache of the same rows
        grown = llama.hf(input_ids=torch.tensor(rows), use_cache=True).past_key_values
    hf_internals.make_growing(grown, room=2)  # fewer than the steps below: it must grow too
    assert all(type(layer) is hf_internals.GrowingLayer for layer in grown.layers)
    nxt = out.logits[:, -1].argmax(-1)
    start = len(rows[0])
    for step in range(4):
        a, plain = continue_from(llama, plain, nxt[:, None].tolist(), start + step)
        b, grown = continue_from(llama, grown, nxt[:, None].tolist(), start + step)
        torch.testing.assert_close(b, a, atol=0, rtol=0)
        nxt = a.argmax(-1)
    # dropping a row keeps the other's keys and values
    hf_internals.select_rows(plain, torch.tensor([1]))
    hf_internals.select_rows(grown, torch.tensor([1]))
    for p, g in zip(plain.layers, grown.layers):
        torch.testing.assert_close(g.keys, p.keys, atol=0, rtol=0)
        torch.testing.assert_close(g.values, p.values, atol=0, rtol=0)


@pytest.mark.parametrize("expand_only", [False, True])
def test_repeated_rows_equal_running_the_repeated_batch(llama, expand_only):
    prefixes = ids_of(llama, SHOTS, SHOTS.replace("3+4=7", "5+4=9"))
    suffix = ids_of(llama, "3+3=")[0]
    with torch.no_grad():
        two = llama.hf(input_ids=torch.tensor(prefixes), use_cache=True).past_key_values
    one = prefix_cache(llama, prefixes[0])
    source = one if expand_only else two
    repeated = hf_internals.repeat_rows(source, 3, expand_only=expand_only)
    assert repeated is not source
    used = [prefixes[0]] * 3 if expand_only else [prefixes[0]] * 3 + [prefixes[1]] * 3
    logits, _ = continue_from(llama, repeated, [suffix] * len(used), len(prefixes[0]))
    want = torch.stack([f[-1] for f in full_logits(llama, [p + suffix for p in used])])
    torch.testing.assert_close(logits, want, atol=1e-10, rtol=0)
    assert source.layers[0].keys.shape[0] == (1 if expand_only else 2)  # the source is left as it was


def test_spliced_layers_come_from_the_source(llama):
    a, b = prefix_cache(llama, ids_of(llama, SHOTS)[0]), prefix_cache(llama, ids_of(llama, SHOTS[::-1])[0])
    hf_internals.splice_layers(a, b, 2)
    assert a.layers[0] is b.layers[0] and a.layers[1] is b.layers[1] and a.layers[2] is not b.layers[2]


# ---- replacing decoder layers' forward --------------------------------------------------------

def test_start_at_skips_the_layers_below_and_restores_the_model():
    model = tiny_model("llama")
    ids = torch.tensor([model.tokens("1 + 2 = ", add_special_tokens=True)])
    before = model.forward(ids)
    with model.hooks(capture=["2.resid_pre"]) as cap:
        model.forward(ids)
    with hf_internals.start_at(model.layers, 2, cap["2.resid_pre"]):
        skipped = model.forward(ids)
    torch.testing.assert_close(skipped, before)
    with hf_internals.start_at(model.layers, 2, torch.zeros_like(cap["2.resid_pre"])):
        assert not torch.allclose(model.forward(ids), before)  # the layers really were skipped
    assert all("forward" not in layer.__dict__ for layer in model.layers)
    torch.testing.assert_close(model.forward(ids), before)


# ---- attention implementation, the SDPA switch, the hub commit ----------------------------------

def test_eager_attention_is_switched_on_and_back_with_the_same_numbers(llama):
    ids = torch.tensor(ids_of(llama, SHOTS))
    assert llama.hf.config._attn_implementation == "sdpa"
    with torch.no_grad():
        plain = llama.hf(input_ids=ids).logits
        with hf_internals.attention_implementation(llama.hf, "eager"):
            assert llama.hf.config._attn_implementation == "eager"
            out = llama.hf(input_ids=ids, output_attentions=True)
    assert llama.hf.config._attn_implementation == "sdpa"
    assert out.attentions[0].shape == (1, llama.n_heads, ids.shape[1], ids.shape[1])
    torch.testing.assert_close(out.logits, plain, atol=1e-5, rtol=0)  # eager takes its softmax in float32


def test_the_sdpa_switch_makes_transformers_take_grouped_heads_under_a_mask(monkeypatch):
    monkeypatch.delenv(hf_internals.FORCE_GQA, raising=False)
    k = v = torch.zeros(1, 2, 5, 16)
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    assert not sdpa_attention.use_gqa_in_sdpa(mask, k, v)  # on CPU a mask means copies by default
    with hf_internals.force_grouped_sdpa():
        assert sdpa_attention.use_gqa_in_sdpa(mask, k, v)
    assert hf_internals.FORCE_GQA not in os.environ


def test_the_hub_commit_is_read_from_the_config_where_transformers_records_it(tmp_path):
    config = tiny_model("llama").hf.config
    config._commit_hash = "0123abc"  # what transformers 4 set on every loaded config
    assert hf_internals.commit_hash(config) == "0123abc"


def test_transformers_5_records_no_commit_on_a_loaded_config(tmp_path):
    # transformers 5 drops `_commit_hash` from configs it loads, so a hub model's weights fingerprint
    # holds None where the commit was meant to be (and adapters fingerprint the tensors instead).
    # When this fails, transformers records a commit again: hub fingerprints (cache keys) change.
    tiny_model("llama").hf.config.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert not hasattr(config, "_commit_hash")
    assert hf_internals.commit_hash(config) is None


def test_merged_rows_keep_their_keys_right_aligned_with_zeros_before(llama):
    short, long = ids_of(llama, "3+3="), ids_of(llama, SHOTS)
    a, b = prefix_cache(llama, short[0]), prefix_cache(llama, long[0])
    hf_internals.make_growing(a, room=2)
    hf_internals.make_growing(b, room=2)
    keys_a, keys_b = a.layers[0].keys.clone(), b.layers[0].keys.clone()
    width = keys_b.shape[2]
    hf_internals.merge_rows(a, b, drop=1, width=width, room=3)  # a's first position dropped
    merged = a.layers[0]
    assert merged.keys.shape[:3] == (2, llama.n_kv_heads, width) and merged.kbuf.shape[2] == width + 3
    torch.testing.assert_close(merged.keys[0, :, width - keys_a.shape[2] + 1:], keys_a[0, :, 1:], atol=0, rtol=0)
    assert not merged.keys[0, :, :width - keys_a.shape[2] + 1].any()
    torch.testing.assert_close(merged.keys[1], keys_b[0], atol=0, rtol=0)

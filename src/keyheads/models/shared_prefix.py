"""Attention over a prefix that groups of batch rows share, without a copy of it per row.

Few-shot prompts share a long prefix (the exemplars). A cache of the usual shape holds its
keys/values once per batch row: building it copies them, dropping a finished row copies them
again, and every decode step reads every copy. On SmolLM2's 4-shot GSM8K that is three
quarters of what a step reads from the cache, as much again as the weights.

Inside `attend_shared(model, prefix)` the model's cache holds only each row's own tokens; the
prefix keys/values are held once per group (rows g*m .. (g+1)*m-1 share group g's prefix), and
every layer attends to both parts under one softmax. Position ids stay the caller's: a row's
own tokens are at positions P.. of its prompt. The numbers equal attention over the
concatenation up to float rounding (tests/models/test_shared_prefix.py).

Hooks on head outputs see the same tensors as with any other attention. Logit soft-capping is
applied as transformers applies it; a sliding window only where it cuts nothing (a prefix and
rows that fit inside it), which `supports` checks up front and the attention again per call.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import SettingError
from . import hf_internals

NAME = "keyheads_shared_prefix"


@dataclass
class SharedPrefix:
    """Per layer, the prefix keys and values [groups, kv_heads, P, head_dim] (None: a layer the
    pass skips); every group serves batch_rows / groups consecutive rows."""

    keys: Sequence[torch.Tensor | None]
    values: Sequence[torch.Tensor | None]

    @classmethod
    def from_cache(cls, cache) -> SharedPrefix:
        keys, values = hf_internals.cache_tensors(cache)
        return cls(keys, values)


_active: ContextVar[SharedPrefix | None] = ContextVar("keyheads_shared_prefix", default=None)


def supports(model, length: int | None = None) -> bool:
    """Whether the model's attention can be split here: it goes through transformers' attention
    functions, and a sliding window (if any) is longer than `length` tokens (None: unbounded,
    as generation is)."""
    window = getattr(model.hf.config, "sliding_window", None)
    if window is not None and (length is None or length > window):
        return False
    return hf_internals.uses_attention_interface(model.hf)


def _causal(q: int, s: int, device) -> torch.Tensor:
    """[q, s] bool: query i (the last q of s positions) sees keys up to its own position."""
    return torch.arange(q, device=device)[:, None] + (s - q) >= torch.arange(s, device=device)[None, :]


# Up to this many query positions per row (a decode step, a knockout pass's few own tokens) the
# split below is fastest; beyond it (a prefill of whole questions) SDPA over the prefix copied in
# front of each row's keys is, by up to 3.5x on a CPU (measured on SmolLM2's shapes), and the copy
# is made once per row.
SPLIT_UP_TO = 16


def _concatenated(query, key, value, kp, vp, attention_mask, scale):
    """Attention over [prefix, own keys] per row with SDPA; output [B, q, H, d]."""
    B, H, q, _ = query.shape
    G, Hkv, P, _ = kp.shape
    S = key.shape[-2]
    k = torch.cat([kp.repeat_interleave(B // G, 0), key], dim=2)
    v = torch.cat([vp.repeat_interleave(B // G, 0), value], dim=2)
    if attention_mask is None:
        attention_mask = _causal(q, S, query.device)
    lead = attention_mask.shape[:-1]
    if attention_mask.dtype == torch.bool:
        mask = torch.cat([attention_mask.new_ones(*lead, P), attention_mask], dim=-1)
    else:
        mask = torch.cat([attention_mask.new_zeros(*lead, P), attention_mask], dim=-1)
    if query.device.type == "cpu":  # CPU kernels take grouped key/value heads under a mask
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scale, enable_gqa=H != Hkv)
    else:  # CUDA's would fall back to the math kernel: repeat them, as transformers does
        k, v = (x.repeat_interleave(H // Hkv, 1) for x in (k, v))
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).contiguous()


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
              sliding_window=None, **kwargs):
    """transformers' attention-function signature: query [B, H, q, d], key/value [B, Hkv, S, d]
    (the rows' own tokens), mask [B|1, 1, q, S] (bool: attend; float: added) or None (causal)."""
    shared = _active.get()
    if shared is None:
        return hf_internals.sdpa_attention(module, query, key, value, attention_mask, scaling=scaling,
                                           dropout=dropout, softcap=softcap, sliding_window=sliding_window, **kwargs)
    kp, vp = shared.keys[module.layer_idx], shared.values[module.layer_idx]
    B, H, q, d = query.shape
    G, Hkv, P, _ = kp.shape
    S, m, g = key.shape[-2], B // G, H // Hkv
    if sliding_window is not None and P + S > sliding_window:
        raise SettingError(f"a shared prefix of {P} tokens and {S} more exceed the sliding window of "
                           f"{sliding_window}: run these prompts without a shared prefix (shared_prefix false)")
    scale = scaling if scaling is not None else d ** -0.5
    if q > SPLIT_UP_TO and softcap is None:
        return _concatenated(query, key, value, kp, vp, attention_mask, scale), None
    # query head h reads key/value head h // g (transformers' repeat_kv order)
    qg = query.reshape(B, Hkv, g * q, d)
    # prefix scores: the m rows of a group stacked against their one prefix, one product per group and head
    qp = qg.reshape(G, m, Hkv, g * q, d).transpose(1, 2).reshape(G, Hkv, m * g * q, d)
    sp = (qp @ kp.transpose(-1, -2) * scale).reshape(G, Hkv, m, g * q, P).transpose(1, 2).reshape(B, Hkv, g * q, P)
    ss = (qg @ key.transpose(-1, -2) * scale).reshape(B, Hkv, g, q, S)
    if softcap is not None:  # before the mask, as transformers caps
        sp, ss = (torch.tanh(x / softcap) * softcap for x in (sp, ss))
    if attention_mask is None:
        attention_mask = _causal(q, S, query.device)
    mask = attention_mask.reshape(-1, 1, 1, q, S) if attention_mask.dim() == 4 else attention_mask
    if mask.dtype == torch.bool:
        ss = ss.masked_fill(~mask, float("-inf"))
    else:
        ss = ss + mask
    scores = torch.cat([sp, ss.reshape(B, Hkv, g * q, S)], dim=-1)
    # softmax in fp32, as transformers' eager attention does; the prefix keeps every row's max finite
    probs = scores.softmax(-1, dtype=torch.float32).to(value.dtype)
    pp = probs[..., :P].reshape(G, m, Hkv, g * q, P).transpose(1, 2).reshape(G, Hkv, m * g * q, P)
    out = (pp @ vp).reshape(G, Hkv, m, g * q, d).transpose(1, 2).reshape(B, Hkv, g * q, d)
    out = out + probs[..., P:] @ value
    return out.reshape(B, H, q, d).transpose(1, 2).contiguous(), None


hf_internals.register_attention(NAME, attention)


@contextmanager
def attend_shared(model, prefix: SharedPrefix | None) -> Iterator[None]:
    """Run `model` with `prefix` before every row's own tokens (see the module docstring); with
    None, as it is."""
    if prefix is None:
        yield
        return
    token = _active.set(prefix)
    try:
        with hf_internals.attention_implementation(model.hf, NAME):
            yield
    finally:
        _active.reset(token)

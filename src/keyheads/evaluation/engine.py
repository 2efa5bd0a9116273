"""Batched forward passes for evaluation: a shared-prefix KV cache, greedy generation, letter logits.

Few-shot prompts of one benchmark share a long prefix (the exemplars). Its keys and values
are computed once and reused for every batch that starts with it, which makes 5-shot MMLU
and few-shot chain-of-thought affordable on a CPU. The prefix is found on token ids (the
longest common prefix of the batch), so every row sees exactly the tokens it would see if
it were run on its own. Rows are left-padded after the prefix; the attention mask and
position ids skip the padding.

Hooks (a knockout) stay installed around these calls by the caller; they must not depend
on the number of positions in a call (Knockout mode "global").
"""
from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from transformers.cache_utils import DynamicLayer

from ..models.model import HookedModel


class GrowingLayer(DynamicLayer):
    """A cache layer that writes new keys/values into spare room instead of concatenating.

    DynamicLayer copies the whole cache at every generated token (torch.cat); with a long
    few-shot prefix repeated for every row that copy costs as much as the model itself.
    """

    def __init__(self, layer: DynamicLayer, room: int):
        super().__init__()
        k, v = layer.keys, layer.values
        b, h, t, d = k.shape
        self.kbuf, self.vbuf = k.new_empty(b, h, t + room, d), v.new_empty(b, h, t + room, v.shape[-1])
        self.kbuf[:, :, :t], self.vbuf[:, :, :t] = k, v
        self.n = t
        self.dtype, self.device, self.is_initialized = k.dtype, k.device, True
        self._views()

    def _views(self) -> None:
        self.keys, self.values = self.kbuf[:, :, :self.n], self.vbuf[:, :, :self.n]

    def update(self, key_states, value_states, *args, **kwargs):
        t = key_states.shape[-2]
        if self.n + t > self.kbuf.shape[-2]:  # out of room: double it
            grow = max(t, self.kbuf.shape[-2])
            self.kbuf = torch.cat([self.kbuf, self.kbuf.new_empty(*self.kbuf.shape[:2], grow, self.kbuf.shape[-1])], 2)
            self.vbuf = torch.cat([self.vbuf, self.vbuf.new_empty(*self.vbuf.shape[:2], grow, self.vbuf.shape[-1])], 2)
        self.kbuf[:, :, self.n:self.n + t] = key_states
        self.vbuf[:, :, self.n:self.n + t] = value_states
        self.n += t
        self._views()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.kbuf, self.vbuf = self.kbuf[indices], self.vbuf[indices]
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.kbuf = self.kbuf.repeat_interleave(repeats, dim=0)
        self.vbuf = self.vbuf.repeat_interleave(repeats, dim=0)
        self._views()


def make_growing(cache, room: int) -> None:
    """Swap a DynamicCache's plain layers for GrowingLayers in place (others are left alone)."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys is not None and layer.keys.numel():
            layers[i] = GrowingLayer(layer, room)


def common_prefix_len(rows: Sequence[Sequence[int]]) -> int:
    first, n = rows[0], min(len(r) for r in rows)
    for i in range(n):
        t = first[i]
        if any(r[i] != t for r in rows):
            return i
    return n


def last_logits_only(model: HookedModel) -> dict:
    """Forward keyword arguments that make the model unembed the last position only, when it can.

    Without them a prefill computes (and allocates) batch x positions x vocabulary logits of which
    only the last position is read.
    """
    try:
        params = inspect.signature(model.hf.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}


class PrefixKV:
    """The KV cache of the last shared prefix, reused while batches keep starting with it.

    Args:
        min_len: prefixes shorter than this are not worth caching.
        slack: reuse the stored prefix even when the batch shares up to `slack` more tokens
            (batches of sorted prompts often share a first word after the exemplars).
    """

    def __init__(self, model: HookedModel, min_len: int = 16, slack: int = 64):
        self.model, self.min_len, self.slack = model, min_len, slack
        self.ids: list[int] | None = None
        self.cache = None
        self.enabled = True
        self.computed = 0  # how many prefixes were computed (tests and logs)

    @torch.no_grad()
    def lookup(self, rows: Sequence[Sequence[int]]):
        """-> (prefix length, a cache holding the prefix for every row) or (0, None)."""
        if not self.enabled:
            return 0, None
        lcp = min(common_prefix_len(rows), min(len(r) for r in rows) - 1)  # every row keeps >= 1 token
        if lcp < self.min_len:
            return 0, None
        stored = self.ids
        if not (stored is not None and lcp - self.slack <= len(stored) <= lcp and list(rows[0][:len(stored)]) == stored):
            ids = torch.tensor([list(rows[0][:lcp])], device=self.model.device)
            out = self.model.hf(input_ids=ids, use_cache=True, **last_logits_only(self.model))  # only the cache is used
            cache = out.past_key_values
            # Sliding-window layers drop old positions, so their cache cannot be shared this way.
            if any(getattr(layer, "is_sliding", False) for layer in getattr(cache, "layers", [])):
                self.enabled = False
                return 0, None
            self.ids, self.cache = list(rows[0][:lcp]), cache
            self.computed += 1
        cache = copy.deepcopy(self.cache)
        for layer in cache.layers:  # a view per row, no copy: the forward's concatenation makes the only one
            layer.keys = layer.keys.expand(len(rows), *layer.keys.shape[1:])
            layer.values = layer.values.expand(len(rows), *layer.values.shape[1:])
        return len(self.ids), cache


@dataclass
class Step:
    """State after a forward pass: logits at the last position and what the next step needs."""

    logits: torch.Tensor  # [batch, vocab]
    cache: object
    mask: torch.Tensor  # [batch, cached + current]
    next_pos: torch.Tensor  # [batch] position id of the next token


@torch.no_grad()
def prefill(model: HookedModel, rows: Sequence[Sequence[int]], prefix: PrefixKV | None = None,
            use_cache: bool = True) -> Step:
    """Run token-id rows (with the shared prefix from `prefix` when possible)."""
    P, past = prefix.lookup(rows) if prefix is not None else (0, None)
    suffixes = [list(r[P:]) for r in rows]
    S = max(len(s) for s in suffixes)
    pad = model.tokenizer.pad_token_id or 0
    ids = torch.full((len(rows), S), pad, dtype=torch.long)
    smask = torch.zeros((len(rows), S), dtype=torch.long)
    for i, s in enumerate(suffixes):
        ids[i, S - len(s):] = torch.tensor(s)
        smask[i, S - len(s):] = 1
    mask = torch.cat([torch.ones(len(rows), P, dtype=torch.long), smask], dim=1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, P:]
    dev = model.device
    out = model.hf(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                   past_key_values=past, use_cache=use_cache, **last_logits_only(model))
    return Step(out.logits[:, -1].float(), out.past_key_values, mask.to(dev), pos[:, -1].to(dev) + 1)


@torch.no_grad()
def greedy_generate(model: HookedModel, rows: Sequence[Sequence[int]], max_new_tokens: int,
                    stop: Callable[[str], int | None], prefix: PrefixKV | None = None) -> list[tuple[str, str]]:
    """Greedy continuation of each row until `stop(text)` returns a cut index, EOS, or the budget.

    Returns (text cut at the stop, why) per row, why in {"stop", "eos", "length"}. Finished
    rows leave the batch, so a batch costs what its unfinished rows cost.
    """
    tok = model.tokenizer
    configured = getattr(getattr(model.hf, "generation_config", None), "eos_token_id", None)
    eos = {tok.eos_token_id} | set(configured if isinstance(configured, (list, tuple)) else [configured])
    eos.discard(None)
    step = prefill(model, rows, prefix)
    make_growing(step.cache, max_new_tokens)
    active = list(range(len(rows)))  # original row index of each batch row
    generated: list[list[int]] = [[] for _ in rows]
    results: list[tuple[str, str] | None] = [None] * len(rows)
    for t in range(max_new_tokens):
        nxt = step.logits.argmax(-1)
        keep = []
        for b, i in enumerate(active):
            token = int(nxt[b])
            if token in eos:
                results[i] = (tok.decode(generated[i], skip_special_tokens=True), "eos")
                continue
            generated[i].append(token)
            text = tok.decode(generated[i], skip_special_tokens=True)
            cut = stop(text)
            if cut is not None:
                results[i] = (text[:cut], "stop")
            elif t == max_new_tokens - 1:
                results[i] = (text, "length")
            else:
                keep.append(b)
        if not keep:
            break
        if len(keep) < len(active):
            index = torch.tensor(keep, device=step.mask.device)
            step.cache.batch_select_indices(index)
            step.mask, step.next_pos, nxt = step.mask[index], step.next_pos[index], nxt[index]
            active = [active[b] for b in keep]
        mask = torch.cat([step.mask, torch.ones_like(step.mask[:, :1])], dim=1)
        out = model.hf(input_ids=nxt[:, None], attention_mask=mask, position_ids=step.next_pos[:, None],
                       past_key_values=step.cache, use_cache=True)
        step = Step(out.logits[:, -1].float(), out.past_key_values, mask, step.next_pos + 1)
    for i, r in enumerate(results):
        if r is None:  # max_new_tokens == 0
            results[i] = ("", "length")
    return results


@torch.no_grad()
def next_token_logits(model: HookedModel, rows: Sequence[Sequence[int]], prefix: PrefixKV | None = None) -> torch.Tensor:
    """Logits [batch, vocab] of the token after each row."""
    return prefill(model, rows, prefix, use_cache=prefix is not None).logits

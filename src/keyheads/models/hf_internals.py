"""Everything keyheads relies on in transformers beyond its documented forward/generate API.

Cache layers and their tensors, the `logits_to_keep` argument, replacing a decoder layer's
forward, private config attributes and transformers' SDPA environment switch all live here,
so that a transformers upgrade that changes one of them breaks this module and its tests
(tests/models/test_hf_internals.py) instead of three packages. Callers use the small named
functions below and never touch these objects themselves.
"""
from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.cache_utils import DynamicLayer
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import WeightRenaming, apply_renamings
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

# transformers' switch (integrations/sdpa_attention.py): let SDPA take grouped key/value heads
# under a mask instead of repeating them per query head
FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"


# ---- unembedding only what is read -----------------------------------------------------------

def last_logits_only(hf: nn.Module) -> dict:
    """Forward keyword arguments that make `hf` unembed the last position only, when it can.

    Without them a prefill computes (and allocates) batch x positions x vocabulary logits of
    which only the last position is read. Model classes without `logits_to_keep` get none.
    """
    try:
        params = inspect.signature(hf.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}


def forward_last(hf: nn.Module, **kwargs):
    """hf(**kwargs) with logits at the last position only (out.logits[:, -1] is what a full
    forward gives there)."""
    return hf(**kwargs, **last_logits_only(hf))


def forward_body(hf: nn.Module, **kwargs) -> bool:
    """Run the decoder without the unembedding (hooks on its layers fire); False, running
    nothing, when the model has no separate body."""
    body = hf.base_model
    if body is hf:
        return False
    body(**kwargs)
    return True


# ---- key/value cache layers -----------------------------------------------------------------

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

    def merge_rows(self, other: DynamicLayer, drop: int, width: int, room: int) -> None:
        """Keep this layer's rows without their first `drop` positions and add `other`'s rows,
        all right-aligned to `width` positions (zeros on the left), with `room` spare."""
        parts = [(self.keys[:, :, drop:], self.values[:, :, drop:]), (other.keys, other.values)]
        b = sum(k.shape[0] for k, _ in parts)
        h, d, dv = self.kbuf.shape[1], self.kbuf.shape[-1], self.vbuf.shape[-1]
        kbuf, vbuf = self.kbuf.new_zeros(b, h, width + room, d), self.vbuf.new_zeros(b, h, width + room, dv)
        r = 0
        for k, v in parts:
            kbuf[r:r + k.shape[0], :, width - k.shape[2]:width] = k
            vbuf[r:r + v.shape[0], :, width - v.shape[2]:width] = v
            r += k.shape[0]
        self.kbuf, self.vbuf, self.n = kbuf, vbuf, width
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


def can_merge(cache) -> bool:
    """Whether rows can be added to the cache (`merge_rows`): every layer is a GrowingLayer."""
    layers = getattr(cache, "layers", None) or []
    return bool(layers) and all(isinstance(layer, GrowingLayer) for layer in layers)


def merge_rows(cache, other, drop: int, width: int, room: int) -> None:
    """Add `other`'s rows to `cache` in place (GrowingLayer.merge_rows, layer by layer)."""
    for layer, new in zip(cache.layers, other.layers):
        layer.merge_rows(new, drop, width, room)


def select_rows(cache, index: torch.Tensor) -> None:
    """Keep only the batch rows `index` of the cache, in place."""
    cache.batch_select_indices(index)


def repeat_rows(cache, repeat: int, expand_only: bool = False):
    """The cache with every row repeated `repeat` times (row-major), as a new cache object.

    With expand_only a one-row cache becomes views of that row. Layers that hold no keys
    (a pass skipped them) are kept as they are, for the caller to replace (splice_layers).
    """
    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        layer = copy.copy(layer)
        if getattr(layer, "keys", None) is None:
            pass
        elif expand_only:
            k, v = layer.keys, layer.values
            layer.keys = (
                k.expand(repeat * k.shape[0], *k.shape[1:]) if k.shape[0] == 1 else k.repeat_interleave(repeat, 0)
            )
            layer.values = (
                v.expand(repeat * v.shape[0], *v.shape[1:]) if v.shape[0] == 1 else v.repeat_interleave(repeat, 0)
            )
        else:
            layer.keys = layer.keys.repeat_interleave(repeat, 0)
            layer.values = layer.values.repeat_interleave(repeat, 0)
        new.layers.append(layer)
    return new


def splice_layers(cache, source, below: int) -> None:
    """Replace the cache's layers below `below` by `source`'s, in place."""
    cache.layers[:below] = source.layers[:below]


# ---- decoder layers -------------------------------------------------------------------------

@contextmanager
def start_at(layers: nn.ModuleList, layer: int, resid: torch.Tensor | None) -> Iterator[None]:
    """Decoder layers below `layer` pass their input through; `layer` reads `resid` instead.

    The layers' forward methods are replaced on the instances (the model's own loop still
    calls every layer, with the hidden states as first argument or `hidden_states`).
    """
    if resid is None or layer == 0:
        yield
        return

    def passthrough(*args, **kwargs):
        return args[0] if args else kwargs["hidden_states"]

    def enter(mod, args, kwargs):
        if args:
            return (resid, *args[1:]), kwargs
        return args, dict(kwargs, hidden_states=resid)

    saved = [layers[i].__dict__.get("forward") for i in range(layer)]
    handle = layers[layer].register_forward_pre_hook(enter, with_kwargs=True)
    try:
        for i in range(layer):
            layers[i].forward = passthrough
        yield
    finally:
        handle.remove()
        for i, fwd in enumerate(saved):
            if fwd is None:
                del layers[i].forward
            else:
                layers[i].forward = fwd


# ---- attention implementation and config ----------------------------------------------------

@contextmanager
def attention_implementation(hf: nn.Module, name: str) -> Iterator[None]:
    """Temporarily run `hf` with another attention implementation ("eager" gives patterns)."""
    config = hf.config
    before = config._attn_implementation
    setter = getattr(hf, "set_attn_implementation", None)
    try:
        if setter is not None:
            setter(name)
        else:
            config._attn_implementation = name
        yield
    finally:
        if setter is not None:
            setter(before)
        else:
            config._attn_implementation = before


@contextmanager
def force_grouped_sdpa() -> Iterator[None]:
    """Set transformers' FORCE_GQA switch while inside; transformers reads it at every call.
    A process that set it itself keeps its own value."""
    if FORCE_GQA in os.environ:
        yield
        return
    os.environ[FORCE_GQA] = "1"
    try:
        yield
    finally:
        del os.environ[FORCE_GQA]


def commit_hash(config) -> str | None:
    """The hub commit a model was loaded from, when transformers recorded one."""
    return getattr(config, "_commit_hash", None)


# ---- attention functions ---------------------------------------------------------------------

def register_attention(name: str, fn) -> None:
    """Register an attention function under `name` (transformers' AttentionInterface), with
    SDPA's boolean masks."""
    AttentionInterface.register(name, fn)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)


def sdpa_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' own SDPA attention function."""
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def uses_attention_interface(hf: nn.Module) -> bool:
    """Whether the model's attention goes through transformers' attention-function interface
    (a registered function then replaces it)."""
    module = inspect.getmodule(type(hf))
    return module is not None and "ALL_ATTENTION_FUNCTIONS" in vars(module)


def cache_tensors(cache) -> tuple[list, list]:
    """Per layer, the keys and values a cache holds [batch, kv_heads, positions, head_dim] (None
    for a layer without any)."""
    keys = [getattr(layer, "keys", None) for layer in cache.layers]
    values = [getattr(layer, "values", None) for layer in cache.layers]
    return keys, values


# ---- the names a model's tensors have in its weights files ------------------------------------

def names_in_files(model: nn.Module, stored: set[str]) -> dict[str, str]:
    """Model tensor name -> its name among `stored` (the files' names), by the renamings transformers applies
    when it loads the files (GPT-NeoX's embed_out is the model's lm_head, legacy gamma/beta, ...). A name
    that one of transformers' converting transforms (fused or split tensors) makes is absent."""
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    return {apply_renamings(key, renamings): key for key in stored}

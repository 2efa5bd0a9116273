"""The one model object every keyheads stage works with.

A model that accelerate dispatched (load_model(device="auto")) may hold its layers on several
devices, and the ones it offloaded on the meta device, loaded by their AlignDevicesHook only
during their own forward. Every method here that reads a weight itself does so under
accelerate's `align_module_device`, and takes and returns activations on the caller's device;
on a model on one device these are no-ops.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from accelerate.utils import align_module_device, has_offloaded_params

from . import hf_internals
from .families import Family, family_for
from .hooks import Edit, hooked


def get_path(root, path: str):
    obj = root
    for part in path.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


@dataclass
class Encoded:
    """A tokenised batch, left-padded so that the last position is every prompt's END."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor

    def as_kwargs(self) -> dict:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
                "position_ids": self.position_ids}


class HookedModel:
    """A Hugging Face causal LM plus its family mapping, dimensions and access points.

    Attributes: ``hf`` (the transformers model), ``tokenizer``, ``family``, ``name``,
    ``n_layers``, ``n_heads``, ``n_kv_heads``, ``head_dim``, ``d_model``.
    """

    def __init__(self, hf_model, tokenizer, name: str = "model", source: str | None = None):
        self.hf = hf_model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.source = source or name
        config = hf_model.config
        self.config = config
        self.family: Family = family_for(config.model_type)
        fam = self.family
        self.n_layers = fam.n_layers(config)
        self.n_heads = fam.n_heads(config)
        self.n_kv_heads = fam.n_kv_heads(config)
        self.head_dim = fam.head_dim(config)
        self.d_model = fam.d_model(config)
        self.parallel_residual = fam.parallel_residual(config)
        self.layers = get_path(hf_model, fam.layers)
        if tokenizer is not None and tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token

    # ---- modules -------------------------------------------------------------------------
    def module(self, path: str):
        return get_path(self.hf, path)

    def layer_module(self, layer: int, path: str):
        return get_path(self.layers[layer], path)

    @property
    def device(self) -> torch.device:
        """Where inputs go: the embedding's device, or the main device of a dispatched model (its
        top-level hook moves inputs there and outputs back; an offloaded embedding is on meta)."""
        main = getattr(getattr(self.hf, "_hf_hook", None), "execution_device", None)
        if main is not None:
            return torch.device(main)
        return self.hf.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.hf.get_input_embeddings().weight.dtype

    @property
    def W_U(self) -> torch.Tensor:
        """Unembedding matrix, [vocab, d_model] (rows are the token directions); on the meta device when
        accelerate offloaded it: read rows with `unembedding_rows`."""
        return self.hf.get_output_embeddings().weight

    def unembedding_rows(self, tokens) -> torch.Tensor:
        """The rows of W_U for `tokens` (ids), a copy on W_U's device, offloaded or not."""
        head = self.hf.get_output_embeddings()
        with align_module_device(head):
            w = head.weight.detach()
            return w[torch.as_tensor(tokens, device=w.device)]

    @property
    def final_norm(self):
        return self.module(self.family.final_norm)

    def unembed(self, resid: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Logits from a residual-stream vector: final norm, then W_U (only `tokens` rows if given)."""
        x = self.final_norm(resid)  # a dispatched module's own hook places its input and weights
        head = self.hf.get_output_embeddings()
        if tokens is None:
            logits = head(x).to(resid.device)
        else:
            with align_module_device(head):
                w = head.weight
                tokens = tokens.to(w.device)
                logits = (x.to(w.device) * w[tokens]).sum(-1)  # w[tokens]: [..., d] matching x's leading dims
                if getattr(head, "bias", None) is not None:
                    logits = logits + head.bias[tokens]
            logits = logits.to(resid.device)
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    # ---- per-layer pieces used by the fast patching path ----------------------------------
    def attn_write_from_out(self, layer: int, attn_out: torch.Tensor) -> torch.Tensor:
        """What attention adds to the residual given the output projection's output."""
        if self.family.post_attn_norm is None:
            return attn_out
        return self.layer_module(layer, self.family.post_attn_norm)(attn_out).to(attn_out.device)

    def mlp_write(self, layer: int, resid: torch.Tensor) -> torch.Tensor:
        """What layer `layer`'s MLP adds to the residual stream when it reads `resid`."""
        fam = self.family
        x = self.layer_module(layer, fam.pre_mlp_norm)(resid)
        x = self.layer_module(layer, fam.mlp)(x)
        if fam.post_mlp_norm is not None:
            x = self.layer_module(layer, fam.post_mlp_norm)(x)
        return x.to(resid.device)

    def out_proj_heads(self, layer: int, head_out: torch.Tensor) -> torch.Tensor:
        """Per-head contribution through the output projection, without bias.

        head_out [..., n_heads, head_dim] -> [..., n_heads, d_model]. Summed over heads and
        plus the projection's bias this is the attention block output.
        """
        proj = self.layer_module(layer, self.family.attn_out_proj)
        with align_module_device(proj):
            w = proj.weight  # Linear: [d_model, n_heads*head_dim]; Conv1D: [n_heads*head_dim, d_model]
            if not self.family.conv1d:
                w = w.T
            w = w.reshape(self.n_heads, self.head_dim, -1)
            out = torch.einsum("...hk,hkd->...hd", head_out.to(w.device), w)
        return out.to(head_out.device)

    def out_proj_bias(self, layer: int) -> torch.Tensor | None:
        """The output projection's bias (None without one); a copy when accelerate offloaded it."""
        proj = self.layer_module(layer, self.family.attn_out_proj)
        if getattr(proj, "bias", None) is None:
            return None
        if not has_offloaded_params(proj):
            return proj.bias
        with align_module_device(proj):
            return proj.bias.detach().clone()

    # ---- running -----------------------------------------------------------------------
    def encode(self, prompts: Sequence[str], add_special_tokens: bool = True) -> Encoded:
        tok = self.tokenizer
        side = tok.padding_side
        tok.padding_side = "left"
        try:
            batch = tok(list(prompts), return_tensors="pt", padding=True, add_special_tokens=add_special_tokens)
        finally:
            tok.padding_side = side
        mask = batch["attention_mask"]
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        dev = self.device
        return Encoded(batch["input_ids"].to(dev), mask.to(dev), pos.to(dev))

    def tokens(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]

    def forward(self, batch: Encoded | torch.Tensor, **kwargs) -> torch.Tensor:
        """Logits [batch, pos, vocab]."""
        if isinstance(batch, Encoded):
            kwargs = {**batch.as_kwargs(), **kwargs}
        else:
            kwargs = {"input_ids": batch.to(self.device), **kwargs}
        return self.hf(**kwargs, use_cache=False).logits

    def run(self, batch, capture: Iterable[str] = (), edit: Mapping[str, Edit] | None = None,
            detach: bool = True, **kwargs):
        """Forward pass with hooks: returns (logits, captured dict)."""
        with hooked(self, capture, edit, detach=detach) as cache:
            logits = self.forward(batch, **kwargs)
        return logits, cache

    def hooks(self, capture: Iterable[str] = (), edit: Mapping[str, Edit] | None = None, detach: bool = True):
        """Context manager installing capture/edit hooks; yields the capture dict."""
        return hooked(self, capture, edit, detach=detach)

    def eager_attention(self):
        """Temporarily switch to eager attention so that attention patterns exist."""
        return hf_internals.attention_implementation(self.hf, "eager")

    @contextmanager
    def grouped_attention(self):
        """On CPU, let SDPA attend grouped key/value heads in place even under a mask.

        With a mask (padding, or queries after a cached prefix) transformers copies every
        key/value head once per query head it serves before calling SDPA: a tenth of a
        batch of knockout passes on SmolLM2 (3 key/value heads for 9 query heads). Torch's
        CPU kernels take the grouping with a mask, and give the same numbers; CUDA's fall
        back to a slower kernel then, so elsewhere this changes nothing. transformers reads
        the switch at every call; a process that set it itself keeps its own value.
        """
        if self.device.type != "cpu" or self.n_kv_heads == self.n_heads:
            yield
            return
        with hf_internals.force_grouped_sdpa():
            yield

    @torch.no_grad()
    def generate(self, prompt: str, max_new_tokens: int = 20) -> str:
        batch = self.encode([prompt])
        out = self.hf.generate(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                               max_new_tokens=max_new_tokens, do_sample=False,
                               pad_token_id=self.tokenizer.pad_token_id)
        return self.tokenizer.decode(out[0, batch.input_ids.shape[1]:], skip_special_tokens=True)

    def __repr__(self) -> str:
        return (f"HookedModel({self.name!r}, family={self.family.name}, layers={self.n_layers}, "
                f"heads={self.n_heads}, kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, d_model={self.d_model})")

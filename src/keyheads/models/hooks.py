"""Named access points on a Hugging Face decoder, read and written with PyTorch hooks.

A point is addressed as ``"{layer}.{name}"`` (for example ``"12.head_out"``) or
``"final_norm"``. Capturing stores the tensor; editing replaces it with what a function
returns. Points that are a module's input use forward pre-hooks, the others forward hooks.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager

import torch

# name -> (family attribute holding the module path, "in" or "out", what it is)
LAYER_POINTS: dict[str, str] = {
    "resid_pre": "residual stream entering the layer",
    "head_out": "per-head attention outputs, input of the output projection [batch, pos, head, head_dim]",
    "attn_out": "attention block output (output projection), before any post-attention norm",
    "attn_write": "what attention adds to the residual stream (after any post-attention norm)",
    "resid_mid": "residual stream between attention and MLP (not for parallel-residual models)",
    "mlp_in": "MLP input, after the pre-MLP norm",
    "mlp_out": "MLP output, before any post-MLP norm",
    "mlp_write": "what the MLP adds to the residual stream (after any post-MLP norm)",
    "resid_post": "residual stream leaving the layer",
    "pattern": "attention pattern [batch, head, query, key] (needs eager attention)",
}
GLOBAL_POINTS = {"final_norm": "output of the final norm, the input of the unembedding"}

Edit = Callable[[torch.Tensor], torch.Tensor]


def parse_point(key: str) -> tuple[int | None, str]:
    if key in GLOBAL_POINTS:
        return None, key
    layer, _, name = key.partition(".")
    if not layer.isdigit() or name not in LAYER_POINTS:
        valid = ", ".join(list(LAYER_POINTS) + list(GLOBAL_POINTS))
        raise KeyError(f"unknown hook point {key!r}: use '<layer>.<name>' with name one of {valid}")
    return int(layer), name


def _locate(model, layer: int | None, name: str):
    """Return (module, side, reshape) for a point; side is 'in', 'out' or 'pattern'."""
    fam = model.family
    if layer is None:
        return model.module(fam.final_norm), "out"
    if not 0 <= layer < model.n_layers:
        raise IndexError(f"layer {layer} out of range: the model has {model.n_layers} layers (0..{model.n_layers - 1})")
    if name == "resid_mid" and model.parallel_residual:
        raise KeyError("resid_mid does not exist in a parallel-residual model: attention and MLP both read resid_pre")
    if name in ("resid_pre", "resid_post"):
        return model.layers[layer], ("in" if name == "resid_pre" else "out")
    path, side = {
        "head_out": (fam.attn_out_proj, "in"),
        "attn_out": (fam.attn_out_proj, "out"),
        "attn_write": (fam.post_attn_norm or fam.attn_out_proj, "out"),
        "resid_mid": (fam.pre_mlp_norm, "in"),
        "mlp_in": (fam.mlp, "in"),
        "mlp_out": (fam.mlp, "out"),
        "mlp_write": (fam.post_mlp_norm or fam.mlp, "out"),
        "pattern": (fam.attn, "pattern"),
    }[name]
    return model.layer_module(layer, path), side


@contextmanager
def hooked(model, capture: Iterable[str] = (), edit: Mapping[str, Edit] | None = None, detach: bool = True):
    """Run the body with capture and edit hooks installed; yields the dict of captures.

    Edits run before captures at the same point, so a capture sees the edited value.
    With ``detach=False`` captures keep their autograd graph (attribution patching).
    """
    edit = dict(edit or {})
    captured: dict[str, torch.Tensor] = {}
    handles = []
    n_heads, head_dim = model.n_heads, model.head_dim

    def store(key, value):
        captured[key] = value.detach() if detach else value

    keys = list(dict.fromkeys(list(edit) + list(capture)))
    for key in keys:
        layer, name = parse_point(key)
        module, side = _locate(model, layer, name)
        fn = edit[key] if key in edit else None
        wants = key in capture
        as_heads = name == "head_out"

        if side == "in":
            def pre_hook(mod, args, kwargs, fn=fn, wants=wants, key=key, as_heads=as_heads):
                if args:
                    x, rest = args[0], args[1:]
                else:
                    x, rest = kwargs["hidden_states"], None
                if as_heads:
                    x = x.reshape(*x.shape[:-1], n_heads, head_dim)
                if fn is not None:
                    x = fn(x)
                if wants:
                    store(key, x)
                if fn is None:
                    return None
                if as_heads:
                    x = x.reshape(*x.shape[:-2], n_heads * head_dim)
                if rest is not None:
                    return (x, *rest), kwargs
                kwargs = dict(kwargs, hidden_states=x)
                return args, kwargs

            handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
        else:
            def post_hook(mod, args, output, fn=fn, wants=wants, key=key, side=side):
                is_tuple = isinstance(output, tuple)
                index = 1 if side == "pattern" else 0
                x = output[index] if is_tuple else output
                if side == "pattern" and x is None:
                    raise RuntimeError("attention pattern requested but the model did not compute it: "
                                       "wrap the call in `with model.eager_attention():`")
                if fn is not None:
                    x = fn(x)
                if wants:
                    store(key, x)
                if fn is None:
                    return None
                if is_tuple:
                    return (*output[:index], x, *output[index + 1:])
                return x

            handles.append(module.register_forward_hook(post_hook))
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()

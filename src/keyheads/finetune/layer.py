"""Trainable slices of frozen projections: zero-initialised fp32 deltas added where a slice acts.

A head's block of W_Q/W_K/W_V is a set of the projection's *output* features (`RowDelta`: adds
x @ dW.T (+ db) to those features); its block of W_O is a set of the output projection's *input*
features (`ColDelta`: adds x[..., idx] @ dW.T to the output). The base weight never requires a
gradient, so no full-matrix weight gradient is computed and the optimizer holds only the deltas.
A delta lives as a child of its projection (so DDP and FSDP see it where the layer is) and acts
through a forward hook on that projection.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ATTR = "keyheads_delta"


def is_conv1d(module: nn.Module) -> bool:
    """GPT-2's Conv1D stores its weight as [in, out]."""
    return type(module).__name__ == "Conv1D"


def in_out(module: nn.Module) -> tuple[int, int]:
    w = module.weight
    return (w.shape[0], w.shape[1]) if is_conv1d(module) else (w.shape[1], w.shape[0])


def delta_dtype(module: nn.Module) -> torch.dtype:
    """fp32 master values for half-precision bases; a float64 base keeps float64."""
    return torch.promote_types(module.weight.dtype, torch.float32)


def _as_linear(module: nn.Module) -> torch.Tensor:
    """The weight as [out, in], a view."""
    return module.weight.T if is_conv1d(module) else module.weight


class _SliceDelta(nn.Module):
    """A zero-initialised delta for the features `index` of `module`'s weight (fp32 for half bases)."""

    kind = ""
    trains_bias = False

    def __init__(self, module: nn.Module, index: list[int], layer: int):
        super().__init__()
        device, dtype = module.weight.device, delta_dtype(module)
        d_in, d_out = in_out(module)
        self.layer = layer
        # On a model without its weights yet (meta, read after FSDP2 shards it: models.sharded) the weight and
        # bias are zeros to be made and `base` is filled from the read weight, but the index must stay known.
        where = "cpu" if device.type == "meta" else device
        self.register_buffer("index", torch.tensor(index, dtype=torch.long, device=where))
        self.weight = nn.Parameter(torch.zeros(self.shape(len(index), d_in, d_out), device=device, dtype=dtype))
        has_bias = self.trains_bias and getattr(module, "bias", None) is not None
        self.bias = nn.Parameter(torch.zeros(len(index), device=device, dtype=dtype)) if has_bias else None
        # W0's trained entries, for weight decay that acts on W0 + delta.
        self.register_buffer("base", self.entries(_as_linear(module).detach()).to(dtype).clone(), persistent=False)

    @staticmethod
    def shape(n: int, d_in: int, d_out: int) -> tuple[int, int]:
        raise NotImplementedError

    def entries(self, w: torch.Tensor) -> torch.Tensor:
        """The trained entries of a [out, in] weight."""
        raise NotImplementedError


class RowDelta(_SliceDelta):
    """Trains output features `index` of a projection (rows of W, entries of its bias)."""

    kind = "rows"
    trains_bias = True

    @staticmethod
    def shape(n: int, d_in: int, d_out: int) -> tuple[int, int]:
        return n, d_in

    def entries(self, w: torch.Tensor) -> torch.Tensor:
        return w[self.index]

    def forward(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(out.dtype)
        return out.index_add(-1, self.index, F.linear(x, self.weight.to(x.dtype), bias).to(out.dtype))

    @torch.no_grad()
    def merge_into(self, module: nn.Module) -> None:
        w = _as_linear(module)
        w[self.index] += self.weight.to(w.dtype)
        if self.bias is not None:
            module.bias[self.index] += self.bias.to(module.bias.dtype)


class ColDelta(_SliceDelta):
    """Trains input features `index` of a projection (columns of W_O); its bias is shared, not trained."""

    kind = "cols"

    @staticmethod
    def shape(n: int, d_in: int, d_out: int) -> tuple[int, int]:
        return d_out, n

    def entries(self, w: torch.Tensor) -> torch.Tensor:
        return w[:, self.index]

    def forward(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out + F.linear(x.index_select(-1, self.index), self.weight.to(x.dtype)).to(out.dtype)

    @torch.no_grad()
    def merge_into(self, module: nn.Module) -> None:
        w = _as_linear(module)
        w[:, self.index] += self.weight.to(w.dtype)


def _hook(module, inputs, output):
    return getattr(module, ATTR)(inputs[0], output)


def attach(module: nn.Module, delta: nn.Module) -> None:
    """Make `delta` a child of `module` and let it act on every forward pass."""
    if hasattr(module, ATTR):
        raise ValueError(f"{type(module).__name__} already carries a trainable delta; detach it first")
    module.add_module(ATTR, delta)
    module._keyheads_handle = module.register_forward_hook(_hook)


def detach(module: nn.Module) -> nn.Module | None:
    delta = getattr(module, ATTR, None)
    if delta is None:
        return None
    module._keyheads_handle.remove()
    del module._keyheads_handle
    delattr(module, ATTR)
    return delta

"""Mean ablation ("knockout"): replace chosen heads' and MLPs' outputs by their mean over
counterfactual data, so that they carry no task information but stay in distribution.

One definition serves the knockout curves, the transfer table, `keyheads eval --knockout` and the
run's knockout row (mean "aligned", the default): means are kept position by position, aligned at
END (the last prompt token): offset 1 is END, offset 2 the token before, and so on. A position the
counterfactual prompts do not have (an input longer than they are, such as a few-shot block in front
of a benchmark question) and every generated token get the mean over all positions instead;
`Knockout.fallback_used` records whether that happened, so reports can say it.

On the pair prompts themselves this is the plain per-position mean and nothing falls back: a
reference prompt has its counterfactual's template and length (for the paper's data, one template
and one-token operands, every counterfactual prompt has the same length), so each of its positions
has an END-aligned mean, and its first answer token is read at END. The curves (analysis/passes.py)
and the evaluator (evaluation/engine.py) both place the means from END, so a knockout row of the
eval table and the curve at the same heads give the same first-token predictions on those prompts.

The other mean, "global", is one mean over all positions (few-shot block included) at every
position. It stays available under its own name (`mean: global` of `keyheads knockout`, `keyheads eval`
and a run's `knockout:` section), and whatever uses it says so.

Position by position needs to know where END is. A forward pass over whole prompts, right-aligned
(left padding), has END last: the default. A pass whose positions all lie away from END (a shared
few-shot prefix that stops before the aligned part, or a generation step) runs under
`away_from_end()`, which gives every position the mean over all positions.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from .components import Components
from .heads import Head
from .mean import DEFAULT_MEAN, KnockoutMean, check_mean
from .models.model import HookedModel

# set while a forward pass holds no position that is within the END-aligned part of a prompt
_AWAY_FROM_END: ContextVar[bool] = ContextVar("knockout_away_from_end", default=False)


@contextmanager
def away_from_end() -> Iterator[None]:
    """Forward passes inside get the mean over all positions at every position, in either mean: a
    shared prefix that ends before the aligned part of every prompt, or generated tokens (after END)."""
    token = _AWAY_FROM_END.set(True)
    try:
        yield
    finally:
        _AWAY_FROM_END.reset(token)


def end_aligned_length(model: HookedModel, prompts: Sequence[str]) -> int:
    """How many positions before END (END included) have an aligned mean: the longest counterfactual
    prompt, in tokens as `compute_means` reads it."""
    return max(len(model.encode([p]).input_ids[0]) for p in prompts)


@dataclass
class Knockout:
    """Mean values for a set of heads and MLP layers, and the hooks that write them.

    Attributes:
        heads: (layer, head) pairs to knock out.
        mlps: MLP layers to knock out (their write into the residual stream).
        head_means: layer -> [max_len, n_heads, head_dim], END-aligned (row -1 is END).
        mlp_means: layer -> [max_len, d_model], END-aligned.
        head_global, mlp_global: layer -> mean over all positions, for the fallback.
        mean: "aligned" (END-aligned per position, global beyond and away from END) or "global".
        fallback_used: set when a position had no aligned mean and the global one was used.
    """

    heads: list[Head]
    mlps: list[int]
    head_means: dict[int, torch.Tensor] = field(default_factory=dict)
    mlp_means: dict[int, torch.Tensor] = field(default_factory=dict)
    head_global: dict[int, torch.Tensor] = field(default_factory=dict)
    mlp_global: dict[int, torch.Tensor] = field(default_factory=dict)
    mean: KnockoutMean = DEFAULT_MEAN
    fallback_used: bool = False

    @property
    def max_len(self) -> int:
        tensors = list(self.head_means.values()) + list(self.mlp_means.values())
        return tensors[0].shape[0] if tensors else 0

    def _values(self, aligned: torch.Tensor, glob: torch.Tensor, length: int) -> torch.Tensor:
        """[length, ...] values for an input of `length` tokens, END-aligned."""
        if self.mean == "global" or _AWAY_FROM_END.get():
            if length > 0:
                self.fallback_used = True
            return glob.expand(length, *glob.shape)
        have = min(length, aligned.shape[0])
        tail = aligned[aligned.shape[0] - have:]
        if have == length:
            return tail
        self.fallback_used = True
        return torch.cat([glob.expand(length - have, *glob.shape), tail], dim=0)

    def edits(self) -> dict:
        """Edit functions for HookedModel.run / .hooks."""
        by_layer: dict[int, list[int]] = {}
        for layer, head in self.heads:
            by_layer.setdefault(layer, []).append(head)
        edits: dict[str, Callable[..., torch.Tensor]] = {}
        for layer, heads in by_layer.items():
            index = torch.tensor(sorted(set(heads)))

            def head_edit(z, layer=layer, index=index):
                means = self._values(self.head_means[layer], self.head_global[layer], z.shape[1]).to(z)
                z = z.clone()
                z[:, :, index] = means[:, index].unsqueeze(0).expand(z.shape[0], -1, -1, -1)
                return z

            edits[f"{layer}.head_out"] = head_edit
        for layer in self.mlps:
            def mlp_edit(x, layer=layer):
                means = self._values(self.mlp_means[layer], self.mlp_global[layer], x.shape[1]).to(x)
                return means.unsqueeze(0).expand(x.shape[0], -1, -1).clone()

            edits[f"{layer}.mlp_write"] = mlp_edit
        return edits

    def to_state(self) -> dict[str, torch.Tensor]:
        state = {}
        for name in ("head_means", "mlp_means", "head_global", "mlp_global"):
            for layer, t in getattr(self, name).items():
                state[f"{name}.{layer}"] = t.contiguous().cpu()
        return state

    @classmethod
    def from_state(cls, heads, mlps, state: dict[str, torch.Tensor],
                   mean: KnockoutMean = DEFAULT_MEAN) -> Knockout:
        ko = cls([Head(*h) for h in heads], [int(m) for m in mlps], mean=mean)
        for key, t in state.items():
            name, layer = key.rsplit(".", 1)
            getattr(ko, name)[int(layer)] = t
        return ko


@torch.no_grad()
def compute_means(model: HookedModel, prompts: Sequence[str], heads: Sequence[Head] = (), mlps: Sequence[int] = (),
                  batch_size: int = 16, mean: KnockoutMean = DEFAULT_MEAN, progress: bool = True) -> Knockout:
    """Mean head outputs and MLP writes over `prompts` (the counterfactual prompts)."""
    check_mean(mean)
    if not prompts:
        raise ValueError("mean ablation needs at least one counterfactual prompt")
    heads, mlps = [Head(*h) for h in heads], sorted({int(m) for m in mlps})
    Components(tuple(heads), tuple(mlps)).check(model.n_layers, model.n_heads)
    head_layers = sorted({l for l, _ in heads})
    points = [f"{l}.head_out" for l in head_layers] + [f"{l}.mlp_write" for l in mlps]
    max_len = end_aligned_length(model, prompts)
    sums: dict[str, torch.Tensor] = {}
    counts = torch.zeros(max_len, dtype=torch.float64)
    total = {}
    n_tokens = 0.0
    for start in tqdm(range(0, len(prompts), batch_size), desc="knockout means", disable=not progress, leave=False):
        batch = model.encode(prompts[start:start + batch_size])
        _, cache = model.run(batch, capture=points)
        mask = batch.attention_mask.to(torch.float64).cpu()  # [b, T]
        T = mask.shape[1]
        counts[max_len - T:] += mask.sum(0)
        n_tokens += mask.sum().item()
        for key in points:
            x = cache[key].to(torch.float64).cpu()
            w = mask.reshape(*mask.shape, *([1] * (x.dim() - 2)))
            per_pos = (x * w).sum(0)  # [T, ...]
            if key not in sums:
                sums[key] = torch.zeros(max_len, *x.shape[2:], dtype=torch.float64)
                total[key] = torch.zeros(x.shape[2:], dtype=torch.float64)
            sums[key][max_len - T:] += per_pos
            total[key] += per_pos.sum(0)
    ko = Knockout(heads, mlps, mean=mean)
    denom = counts.clamp(min=1).reshape(max_len, *([1] * 0))
    for key in points:
        layer, name = key.split(".")
        shape = (max_len,) + (1,) * (sums[key].dim() - 1)
        aligned = (sums[key] / denom.reshape(shape)).to(model.dtype)
        glob = (total[key] / max(n_tokens, 1.0)).to(model.dtype)
        if name == "head_out":
            ko.head_means[int(layer)], ko.head_global[int(layer)] = aligned, glob
        else:
            ko.mlp_means[int(layer)], ko.mlp_global[int(layer)] = aligned, glob
    return ko

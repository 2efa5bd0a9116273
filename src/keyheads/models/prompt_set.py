"""Prompts tokenised once and grouped for END-only forward passes.

Prompts of one length that share a token prefix (a few-shot block) form a group whose prefix
runs once, its keys and values serving every member, which then runs only its own suffix.
The rest are batched by length with left padding, as a plain forward pass would batch them.
Only END is unembedded. The knockout engine built on these groups is analysis/passes.py;
data/correct.py uses the clean passes alone.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from . import hf_internals
from .model import HookedModel
from .shared_prefix import SharedPrefix, attend_shared, supports


@dataclass
class Group:
    """Prompts run together: of equal length sharing their first `len(prefix)` tokens, or (with
    no prefix) of similar length, left-padded to the longest."""

    index: list[int]                  # positions of the members in the prompt list
    length: int                       # tokens per member (padded length for a padded group)
    prefix: list[int]                 # the shared ids (may be empty)
    suffixes: torch.Tensor            # [members, length - len(prefix)] ids
    mask: torch.Tensor | None = None  # [members, length] attention mask of a padded group


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _cluster(rows: list[list[int]], min_prefix: int) -> list[list[int]]:
    """Split equal-length rows into runs of sorted order that are cheaper computed together.

    A run costs its shared prefix once plus every member's suffix; a row joins the run when
    that is cheaper than starting a new run with it.
    """
    order = sorted(range(len(rows)), key=lambda i: rows[i])
    n_tok = len(rows[0])
    runs: list[list[int]] = []
    lcp = 0
    for i in order:
        if runs:
            new = min(lcp, _lcp(rows[runs[-1][0]], rows[i]), n_tok - 1)
            size = len(runs[-1])
            joined = new + (size + 1) * (n_tok - new)
            apart = lcp + size * (n_tok - lcp) + n_tok
            if new >= min_prefix and joined <= apart:
                runs[-1].append(i)
                lcp = new
                continue
        runs.append([i])
        lcp = n_tok - 1
    return runs


class PromptSet:
    """Prompts tokenised once and grouped for END-only passes.

    Prompts of one length whose shared prefix pays for itself form prefix groups; the rest
    are batched by length with left padding, as a plain forward pass would batch them.
    """

    def __init__(self, model: HookedModel, prompts: Sequence[str], batch_size: int = 16, min_prefix: int = 8):
        self.model = model
        self.n = len(prompts)
        self.lengths = [0] * self.n
        ids = [model.tokens(p, add_special_tokens=True) for p in prompts]
        if any(not r for r in ids):
            raise ValueError("an empty prompt has no END position")
        by_len: dict[int, list[int]] = {}
        for i, r in enumerate(ids):
            by_len.setdefault(len(r), []).append(i)
            self.lengths[i] = len(r)
        self.groups: list[Group] = []
        loose: list[int] = []
        for length, members in sorted(by_len.items()):
            # a sliding window shorter than the prompt would cut keys a cached prefix keeps
            if not supports(model, length):
                loose += members
                continue
            for run in _cluster([ids[i] for i in members], min_prefix):
                index = [members[j] for j in run]
                P = min(min(_lcp(ids[index[0]], ids[k]) for k in index), length - 1)
                if len(index) < 2 or P < min_prefix:
                    loose += index
                    continue
                self.groups.append(Group(index, length, ids[index[0]][:P], torch.tensor([ids[k][P:] for k in index])))
        loose.sort(key=lambda i: (len(ids[i]), i))
        pad = model.tokenizer.pad_token_id or 0
        for c in range(0, len(loose), batch_size):
            index = loose[c:c + batch_size]
            T = max(len(ids[i]) for i in index)
            suffixes = torch.full((len(index), T), pad, dtype=torch.long)
            mask = torch.zeros((len(index), T), dtype=torch.long)
            for row, i in enumerate(index):
                suffixes[row, T - len(ids[i]):] = torch.tensor(ids[i])
                mask[row, T - len(ids[i]):] = 1
            self.groups.append(Group(index, T, [], suffixes, None if bool(mask.all()) else mask))

    def longer_than(self, length: int) -> int:
        return sum(1 for n in self.lengths if n > length)


def run_end(model: HookedModel, ids: torch.Tensor, start: int, past=None, want_cache: bool = False,
            mask: torch.Tensor | None = None, shared: SharedPrefix | None = None):
    """Forward of `ids` at positions start.., after `past` (a cache) or `shared` (a prefix each
    group of rows attends once), or a padded batch (`mask`, no cache); END logits only."""
    rows, n = ids.shape
    dev = model.device
    kwargs = dict(input_ids=ids.to(dev), use_cache=want_cache or past is not None)
    if mask is not None:
        kwargs.update(attention_mask=mask.to(dev), position_ids=(mask.cumsum(-1) - 1).clamp(min=0).to(dev))
    else:
        kwargs.update(position_ids=torch.arange(start, start + n, device=dev).expand(rows, n))
    if past is not None:
        kwargs.update(past_key_values=past, attention_mask=torch.ones(rows, start + n, dtype=torch.long, device=dev))
    with attend_shared(model, shared):
        out = hf_internals.forward_last(model.hf, **kwargs)
    return out.logits[:, -1].float(), out.past_key_values


@torch.no_grad()
def clean_passes(model: HookedModel, prompts: PromptSet, edits: dict, progress: bool = False,
                 desc: str = "passes") -> Iterator[Group]:
    """Run every group once without knockout, with `edits` installed while its own tokens run;
    yields each group after its pass. The last position of what the edits see is END.

    The shared prefix runs before the edits are installed, so an edit that keeps x[:, -1] sees
    END only; an edit that reads whole rows (an attention pattern) sees every key, prefix included.
    """
    for group in tqdm(prompts.groups, desc=desc, disable=not progress, leave=False):
        group_pass(model, group, edits)
        yield group


@torch.no_grad()
def group_pass(model: HookedModel, group: Group, edits: dict | None = None) -> torch.Tensor:
    """END logits [members, vocab] of one group, `edits` installed while its own tokens run."""
    P, m = len(group.prefix), len(group.index)
    with model.grouped_attention():
        cache = run_end(model, torch.tensor([group.prefix]), 0, want_cache=True)[1] if P else None
        with model.hooks(edit=edits or {}):
            logits, _ = run_end(model, group.suffixes, P,
                                hf_internals.repeat_rows(cache, m, expand_only=True) if P else None, mask=group.mask)
    return logits

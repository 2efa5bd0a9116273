"""Batched forward passes for evaluation: a shared-prefix KV cache, greedy generation, letter logits.

Few-shot prompts of one benchmark share a long prefix (the exemplars). Its keys and values
are computed once and reused for every batch that starts with it, which makes 5-shot MMLU
and few-shot chain-of-thought affordable on a CPU. The prefix is found on token ids (the
longest common prefix of the batch), so every row sees exactly the tokens it would see if
it were run on its own. The batch attends to one copy of the prefix (models.shared_prefix):
the cache holds only each row's own tokens, left-padded; the attention mask and position ids
skip the padding.

Hooks (a knockout) stay installed around these calls by the caller; they must not depend
on the number of positions in a call (Knockout mode "global").
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..models import hf_internals
from ..models.model import HookedModel
from ..models.shared_prefix import SharedPrefix, attend_shared, supports


def common_prefix_len(rows: Sequence[Sequence[int]]) -> int:
    first, n = rows[0], min(len(r) for r in rows)
    for i in range(n):
        t = first[i]
        if any(r[i] != t for r in rows):
            return i
    return n


class PrefixKV:
    """The keys/values of the last shared prefix, reused while batches keep starting with it.

    Args:
        min_len: prefixes shorter than this are not worth caching.
        slack: reuse the stored prefix even when the batch shares up to `slack` more tokens
            (batches of sorted prompts often share a first word after the exemplars).
    """

    def __init__(self, model: HookedModel, min_len: int = 16, slack: int = 64):
        self.model, self.min_len, self.slack = model, min_len, slack
        self.ids: list[int] | None = None
        self.shared: SharedPrefix | None = None
        # sliding-window or soft-capped attention cannot be split into prefix and rest
        self.enabled = supports(model)
        self.computed = 0  # how many prefixes were computed (tests and logs)

    @torch.no_grad()
    def lookup(self, rows: Sequence[Sequence[int]]) -> tuple[int, SharedPrefix | None]:
        """-> (prefix length, its keys/values) or (0, None)."""
        if not self.enabled:
            return 0, None
        lcp = min(common_prefix_len(rows), min(len(r) for r in rows) - 1)  # every row keeps >= 1 token
        if lcp < self.min_len:
            return 0, None
        stored = self.ids
        if not (
            stored is not None and lcp - self.slack <= len(stored) <= lcp and list(rows[0][: len(stored)]) == stored
        ):
            ids = torch.tensor([list(rows[0][:lcp])], device=self.model.device)
            cache = hf_internals.forward_last(self.model.hf, input_ids=ids, use_cache=True).past_key_values
            stored = self.ids = list(rows[0][:lcp])
            self.shared = SharedPrefix.from_cache(cache)
            self.computed += 1
        return len(stored), self.shared


@dataclass
class Step:
    """State after a forward pass: logits at the last position and what the next step needs."""

    logits: torch.Tensor  # [batch, vocab]
    cache: object  # each row's own tokens (after the shared prefix)
    mask: torch.Tensor  # [batch, cached + current]
    next_pos: torch.Tensor  # [batch] position id of the next token
    shared: SharedPrefix | None = None


@torch.no_grad()
def prefill(model: HookedModel, rows: Sequence[Sequence[int]], prefix: PrefixKV | None = None,
            use_cache: bool = True) -> Step:
    """Run token-id rows (with the shared prefix from `prefix` when possible)."""
    P, shared = prefix.lookup(rows) if prefix is not None else (0, None)
    suffixes = [list(r[P:]) for r in rows]
    S = max(len(s) for s in suffixes)
    pad = model.tokenizer.pad_token_id or 0
    ids = torch.full((len(rows), S), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), S), dtype=torch.long)
    for i, s in enumerate(suffixes):
        ids[i, S - len(s):] = torch.tensor(s)
        mask[i, S - len(s):] = 1
    pos = P + (mask.cumsum(-1) - 1).clamp(min=0)
    dev = model.device
    with attend_shared(model, shared):
        out = hf_internals.forward_last(model.hf, input_ids=ids.to(dev), attention_mask=mask.to(dev),
                                        position_ids=pos.to(dev), use_cache=use_cache)
    return Step(out.logits[:, -1].float(), out.past_key_values, mask.to(dev), pos[:, -1].to(dev) + 1, shared)


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
    hf_internals.make_growing(step.cache, max_new_tokens)
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
            # a CPU index selects on any device: a dispatched model keeps each layer's cache on its own
            hf_internals.select_rows(step.cache, torch.tensor(keep))
            index = torch.tensor(keep, device=step.mask.device)
            step.mask, step.next_pos, nxt = step.mask[index], step.next_pos[index], nxt[index]
            active = [active[b] for b in keep]
        mask = torch.cat([step.mask, torch.ones_like(step.mask[:, :1])], dim=1)
        with attend_shared(model, step.shared):
            out = model.hf(input_ids=nxt[:, None], attention_mask=mask, position_ids=step.next_pos[:, None],
                           past_key_values=step.cache, use_cache=True)
        step = Step(out.logits[:, -1].float(), out.past_key_values, mask, step.next_pos + 1, step.shared)
    return [("", "length") if r is None else r for r in results]  # None: max_new_tokens == 0


@torch.no_grad()
def next_token_logits(
    model: HookedModel, rows: Sequence[Sequence[int]], prefix: PrefixKV | None = None
) -> torch.Tensor:
    """Logits [batch, vocab] of the token after each row."""
    return prefill(model, rows, prefix, use_cache=False).logits

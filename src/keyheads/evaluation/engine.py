"""Batched forward passes for evaluation: a shared-prefix KV cache, greedy generation, letter logits.

Few-shot prompts of one benchmark share a long prefix (the exemplars). Its keys and values
are computed once and reused for every batch that starts with it, which makes 5-shot MMLU
and few-shot chain-of-thought affordable on a CPU. The prefix is found on token ids (the
longest common prefix of the batch), so every row sees exactly the tokens it would see if
it were run on its own. The batch attends to one copy of the prefix (models.shared_prefix):
the cache holds only each row's own tokens, left-padded; the attention mask and position ids
skip the padding.

Hooks (a knockout) stay installed around these calls by the caller. A knockout with the aligned
mean treats the last tokens of a prompt position by position from END (keyheads.knockout): the
suffix pass has END last in every row (left padding), the shared prefix leaves each row at least
`PrefixKV.keep` tokens of its own and runs, as every generation step does, under
`knockout.away_from_end()`, so a row gets the same means with or without a shared prefix.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from ..knockout import away_from_end
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
        keep: the last tokens of every row that stay out of the prefix (at least 1): those the
            hooks treat position by position from END (an aligned knockout's means).
    """

    def __init__(self, model: HookedModel, min_len: int = 16, slack: int = 64, keep: int = 1):
        self.model, self.min_len, self.slack, self.keep = model, min_len, slack, max(1, keep)
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
        lcp = min(common_prefix_len(rows), min(len(r) for r in rows) - self.keep)  # every row keeps its own end
        if lcp < self.min_len:
            return 0, None
        stored = self.ids
        if not (
            stored is not None and lcp - self.slack <= len(stored) <= lcp and list(rows[0][: len(stored)]) == stored
        ):
            ids = torch.tensor([list(rows[0][:lcp])], device=self.model.device)
            with away_from_end():  # the prefix ends before the part of any row that is aligned at END
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


@torch.no_grad()
def prefill(model: HookedModel, rows: Sequence[Sequence[int]], prefix: PrefixKV | None = None,
            use_cache: bool = True) -> Step:
    """Run token-id rows (with the shared prefix from `prefix` when possible)."""
    P, shared = prefix.lookup(rows) if prefix is not None else (0, None)
    return prefill_after(model, rows, P, shared, use_cache)


@torch.no_grad()
def prefill_after(model: HookedModel, rows: Sequence[Sequence[int]], P: int, shared: SharedPrefix | None,
                  use_cache: bool = True) -> Step:
    """Run each row's tokens after its first P, which `shared` holds (P = 0: none)."""
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
    return Step(out.logits[:, -1].float(), out.past_key_values, mask.to(dev), pos[:, -1].to(dev) + 1)


def _left_pad(mask: torch.Tensor, width: int) -> torch.Tensor:
    return torch.cat([mask.new_zeros(mask.shape[0], width - mask.shape[1]), mask], dim=1)


def _merge(running: Step, new: Step, room: int) -> None:
    """Add `new`'s rows to `running` in place, both right-aligned; columns that are padding in
    every running row are dropped, so the cache stays as wide as its longest live row."""
    drop = int((running.mask.cumsum(-1) == 0).sum(-1).min())
    width = max(running.mask.shape[1] - drop, new.mask.shape[1])
    hf_internals.merge_rows(running.cache, new.cache, drop, width, room)
    running.mask = torch.cat([_left_pad(running.mask[:, drop:], width), _left_pad(new.mask, width)])
    running.next_pos = torch.cat([running.next_pos, new.next_pos])


def eos_ids(model: HookedModel) -> set[int]:
    """The token ids that end a row: the tokenizer's EOS and the generation config's."""
    configured = getattr(getattr(model.hf, "generation_config", None), "eos_token_id", None)
    eos = {model.tokenizer.eos_token_id} | set(configured if isinstance(configured, (list, tuple)) else [configured])
    eos.discard(None)
    return eos


@torch.no_grad()
def generate_stream(model: HookedModel, rows: Sequence[Sequence[int]], max_new_tokens: int,
                    stop: Callable[[str], int | None] | None, prefix: PrefixKV | None = None,
                    batch_size: int | None = None, check_every: int | None = None
                    ) -> Iterator[tuple[int, tuple[str, str]]]:
    """Greedy continuation of each row until `stop(text)` returns a cut index, EOS, or the budget.

    Yields (row index, (text cut at the stop, why)) as each row ends, why in {"stop", "eos",
    "length"}. At most `batch_size` rows (default: all) decode together; a row that ends
    leaves the batch and the next waiting row takes its place (continuous batching), so the
    batch stays full until the rows run out instead of shrinking to its slowest row. Every row
    attends the prefix `prefix` finds for all the rows. `stop=None` checks only EOS and the budget.

    The chosen tokens stay on the model's device and are read back every `check_every` steps
    (default 1 on a CPU; 8 on an accelerator, where reading waits for the device to finish).
    Each live row is then checked token by token, so it ends exactly where a check per step
    would end it; what it generated past that end is dropped.
    """
    if not rows:
        return
    if max_new_tokens <= 0:
        yield from ((i, ("", "length")) for i in range(len(rows)))
        return
    tok, eos = model.tokenizer, eos_ids(model)
    P, shared = prefix.lookup(rows) if prefix is not None else (0, None)
    width = batch_size or len(rows)
    every = check_every or (1 if model.device.type == "cpu" else 8)
    waiting = deque(range(len(rows)))
    generated: dict[int, list[int]] = {}

    def start() -> Step:
        """Prefill the next waiting rows that fit (at most `width - len(active)`)."""
        new = [waiting.popleft() for _ in range(min(width - len(active), len(waiting)))]
        step = prefill_after(model, [rows[i] for i in new], P, shared)
        hf_internals.make_growing(step.cache, max_new_tokens)
        generated.update((i, []) for i in new)
        active.extend(new)
        return step

    active: list[int] = []  # row index of each batch row
    batch = start()
    nxt = batch.logits.argmax(-1)

    def finish(i: int, token: int) -> tuple[str, str] | None:
        """Take row i's next token; its result once it has ended."""
        if token in eos:
            return tok.decode(generated[i], skip_special_tokens=True), "eos"
        generated[i].append(token)
        if stop is not None:
            text = tok.decode(generated[i], skip_special_tokens=True)
            if (cut := stop(text)) is not None:
                return text[:cut], "stop"
        if len(generated[i]) == max_new_tokens:
            return tok.decode(generated[i], skip_special_tokens=True), "length"
        return None

    def admit() -> int:
        """Fill the batch from the waiting rows (merging needs caches whose rows can be re-laid);
        -> how many joined. Their first tokens are the last of `nxt`."""
        nonlocal batch, nxt
        if not waiting or len(active) == width or (active and not hf_internals.can_merge(batch.cache)):
            return 0
        if not active:
            batch = start()
            nxt = batch.logits.argmax(-1)
            return len(active)
        before = len(active)
        step = start()
        _merge(batch, step, max_new_tokens)
        nxt = torch.cat([nxt, step.logits.argmax(-1)])
        return len(active) - before

    pending: list[torch.Tensor] = []
    while active:
        pending.append(nxt)
        if len(pending) >= every or max(len(generated[i]) for i in active) + len(pending) >= max_new_tokens:
            chunk, pending, keep = torch.stack(pending, 1).tolist(), [], []
            for b, i in enumerate(active):
                for token in chunk[b]:
                    if token < 0:  # a row that joined after these steps
                        continue
                    if (result := finish(i, token)) is not None:
                        del generated[i]
                        yield i, result
                        break
                else:
                    keep.append(b)
            if len(keep) < len(active):
                if keep:  # a CPU index selects on any device: a dispatched model keeps each layer's cache on its own
                    hf_internals.select_rows(batch.cache, torch.tensor(keep))
                    index = torch.tensor(keep, device=batch.mask.device)
                    batch.mask, batch.next_pos, nxt = batch.mask[index], batch.next_pos[index], nxt[index]
                active[:] = [active[b] for b in keep]
                if joined := admit():
                    # the rows that stay have read their last token; the new ones' first is still to read
                    pending = [torch.cat([torch.full_like(nxt[:-joined], -1), nxt[-joined:]])]
            if not active:
                break
        batch.mask = torch.cat([batch.mask, torch.ones_like(batch.mask[:, :1])], dim=1)
        with attend_shared(model, shared), away_from_end():  # a generated token comes after END
            out = model.hf(input_ids=nxt[:, None], attention_mask=batch.mask, position_ids=batch.next_pos[:, None],
                           past_key_values=batch.cache, use_cache=True)
        nxt, batch.cache, batch.next_pos = out.logits[:, -1].argmax(-1), out.past_key_values, batch.next_pos + 1


@torch.no_grad()
def next_token_logits(
    model: HookedModel, rows: Sequence[Sequence[int]], prefix: PrefixKV | None = None
) -> torch.Tensor:
    """Logits [batch, vocab] of the token after each row."""
    return prefill(model, rows, prefix, use_cache=False).logits

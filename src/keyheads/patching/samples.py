"""Prompt pairs prepared for patching: tokenised, validated and batched.

Patching compares a reference prompt with its counterfactual position by position, so
both must have the same number of tokens. Batches mix lengths: rows are padded on the
left, so that END (the last position) is a real token in every row, and the attention
mask keeps the padding out of every real position.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.pairs import answer_continuation, read_pairs
from ..errors import BadSample
from ..models.model import HookedModel


@dataclass
class PatchSample:
    """One reference/counterfactual pair, tokenised.

    Attributes:
        line: line number in the data file (for error messages).
        ref_ids, cf_ids: token ids of the two prompts (same length).
        answer_id: the first token of the answer, as it follows the reference prompt.
    """

    line: int | None
    ref_ids: list[int]
    cf_ids: list[int]
    answer_id: int


def load_patch_samples(model: HookedModel, path: str | Path, limit: int | None = None,
                 first_token_only: bool = False) -> list[PatchSample]:
    """A pairs JSONL file (read and checked by keyheads.data.pairs.read_pairs), tokenised for patching.

    A pair patching cannot use raises BadSample naming its line (an empty file: NoPairs)."""
    pairs = read_pairs(path)
    samples = []
    tok = model.tokenizer
    for pair in pairs:
        line = pair.line
        ref = tok(pair.reference)["input_ids"]
        cf = tok(pair.counterfactual)["input_ids"]
        if len(ref) != len(cf):
            raise BadSample(f"{path}:{line}: reference has {len(ref)} tokens but counterfactual has {len(cf)}; "
                            "patching needs aligned prompts of equal token length")
        # the answer's tokens as they follow the prompt (a lone "8" may tokenise differently)
        found = answer_continuation(tok, pair.reference, pair.answer)
        if found is None:
            raise BadSample(f"{path}:{line}: the answer {pair.answer!r} does not start a token of its own "
                            "after the reference prompt")
        answer_id, _, n_answer = found
        if n_answer > 1 and not first_token_only:
            raise BadSample(f"{path}:{line}: the answer {pair.answer!r} is {n_answer} tokens; patching measures "
                            "one answer token (use single-token answers, or --first-token)")
        samples.append(PatchSample(line, ref, cf, answer_id))
        if limit is not None and len(samples) >= limit:
            break
    return samples


@dataclass
class Batch:
    """Samples padded on the left to one length: [batch, pos] id tensors and the answer ids.

    `mask` is the attention mask [batch, pos], or None when no row is padded (the model
    then takes its unmasked causal path, as for a single prompt).
    """

    index: list[int]           # positions in the original sample list
    ref: torch.Tensor
    cf: torch.Tensor
    answer: torch.Tensor
    mask: torch.Tensor | None = None

    def lengths(self) -> list[int]:
        """Each row's real token count."""
        if self.mask is None:
            return [self.ref.shape[1]] * self.ref.shape[0]
        return self.mask.sum(-1).tolist()

    def by_length(self, pass_share: float = 0.05) -> list[Batch]:
        """The batch cut into runs of rows of similar length, each padded only to its longest.

        A batch that mixes lengths pads every short row to the longest. A pass over part of
        the rows costs about as much as the rows it computes plus a fixed share of the work
        (hooks, per-layer operations, smaller matrix products), so a part is split off only
        where it saves more padding than `pass_share` of the batch's real tokens. Only rows in
        order of length, as `batches` makes them, are split; any other batch stays one pass.
        """
        lengths = self.lengths()
        if self.mask is None or lengths != sorted(lengths):
            return [self]
        cuts = _cuts(lengths, len(lengths), group_cost=pass_share * sum(lengths))
        if len(cuts) == 2:
            return [self]
        parts = []
        for i, j in zip(cuts, cuts[1:]):
            width = lengths[j - 1]
            mask = self.mask[i:j, -width:]
            parts.append(Batch(self.index[i:j], self.ref[i:j, -width:], self.cf[i:j, -width:], self.answer[i:j],
                               None if bool(mask.all()) else mask))
        return parts

    def inputs(self) -> dict:
        """Keyword arguments that make the model see each row as if it were unpadded."""
        if self.mask is None:
            return {}
        # real tokens count positions from 0, as in an unpadded prompt
        return {"attention_mask": self.mask, "position_ids": (self.mask.cumsum(-1) - 1).clamp(min=0)}


def _cuts(lengths: list[int], max_size: int, groups: int | None = None, group_cost: float = 0.0) -> list[int]:
    """Where to cut sorted lengths into groups of at most `max_size` that pad least.

    With `groups` set, exactly that many groups; otherwise any number, each costing
    `group_cost` padded positions on top of its padding. Dynamic programming over the cut
    points (best[j]: the cheapest cut of the first j rows); ties go to the earliest cut, so
    the result is deterministic.
    """
    n = len(lengths)
    prefix = [0]
    for length in lengths:
        prefix.append(prefix[-1] + length)

    def pad(i: int, j: int) -> int:  # padding of one group of sorted rows i..j-1
        return (j - i) * lengths[j - 1] - (prefix[j] - prefix[i])

    def cheapest(before: list[float] | None, ends: range) -> tuple[list[float], list[int]]:
        """Costs and back pointers of one round of groups ending at `ends`, each after a cut costing `before`.

        before=None: a group may follow any cut of its own round (any number of groups).
        """
        cost = [0.0 if before is None else float("inf")] + [float("inf")] * n
        after = cost if before is None else before
        back = [0] * (n + 1)
        for j in ends:
            for i in range(max(0, j - max_size), j):
                c = after[i] + pad(i, j) + group_cost
                if c < cost[j]:
                    cost[j], back[j] = c, i
        return cost, back

    cuts, j = [n], n
    if groups is None:
        _, back = cheapest(None, range(1, n + 1))
        while j:
            j = back[j]
            cuts.append(j)
    else:
        # round g leaves in best[j] the cheapest cut of the first j rows into g groups; only
        # ends from which the other groups can still take the remaining rows are tried
        best, backs = [0.0] + [float("inf")] * n, []
        for g in range(1, groups + 1):
            best, back = cheapest(best, range(max(g, n - (groups - g) * max_size), min(n, g * max_size) + 1))
            backs.append(back)
        for back in reversed(backs):
            j = back[j]
            cuts.append(j)
    return cuts[::-1]


def batches(samples: Sequence[PatchSample], batch_size: int, device, pad_id: int = 0) -> Iterator[Batch]:
    """Deterministic batches of at most `batch_size` samples in order of token length.

    Sorting by length and cutting where lengths jump keeps the padding, which every pass
    computes for nothing, small. `pad_id` only fills masked positions, so its value does
    not matter.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].ref_ids))
    # the fewest batches keep matrix products as large as cutting every batch_size rows
    # does; among such cuts, the one that pads least
    fewest = -(-len(order) // batch_size)
    cuts = _cuts([len(samples[i].ref_ids) for i in order], batch_size, groups=fewest) if order else [0]
    for start, stop in zip(cuts, cuts[1:]):
        chunk = order[start:stop]
        width = max(len(samples[i].ref_ids) for i in chunk)

        def padded(ids: list[int], width: int = width) -> list[int]:
            return [pad_id] * (width - len(ids)) + ids

        lengths = torch.tensor([len(samples[i].ref_ids) for i in chunk])
        mask = None
        if (lengths < width).any():
            mask = (torch.arange(width)[None] >= (width - lengths)[:, None]).long().to(device)
        yield Batch(
            chunk,
            torch.tensor([padded(samples[i].ref_ids) for i in chunk], device=device),
            torch.tensor([padded(samples[i].cf_ids) for i in chunk], device=device),
            torch.tensor([samples[i].answer_id for i in chunk], device=device),
            mask,
        )

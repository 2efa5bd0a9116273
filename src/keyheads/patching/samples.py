"""Prompt pairs prepared for patching: tokenised, validated and batched.

Patching compares a reference prompt with its counterfactual position by position, so
both must have the same number of tokens. Batches mix lengths: rows are padded on the
left, so that END (the last position) is a real token in every row, and the attention
mask keeps the padding out of every real position.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from ..data.pairs import NoPairs, answer_continuation, read_pairs
from ..models.model import HookedModel


class BadSample(ValueError):
    pass


@dataclass
class PatchSample:
    """One reference/counterfactual pair, tokenised.

    Attributes:
        line: line number in the data file (for error messages).
        ref_ids, cf_ids: token ids of the two prompts (same length).
        answer_id: the first token of the answer, as it follows the reference prompt.
    """

    line: int
    ref_ids: list[int]
    cf_ids: list[int]
    answer_id: int


def load_samples(model: HookedModel, path: str | Path, limit: int | None = None,
                 first_token_only: bool = False) -> list[PatchSample]:
    """A pairs JSONL file (read and checked by keyheads.data.pairs.read_pairs), tokenised for patching."""
    try:
        pairs = read_pairs(path)
    except NoPairs as err:
        raise BadSample(str(err)) from err
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

    def inputs(self) -> dict:
        """Keyword arguments that make the model see each row as if it were unpadded."""
        if self.mask is None:
            return {}
        # real tokens count positions from 0, as in an unpadded prompt
        return {"attention_mask": self.mask, "position_ids": (self.mask.cumsum(-1) - 1).clamp(min=0)}


def batches(samples: Sequence[PatchSample], batch_size: int, device, pad_id: int = 0) -> Iterator[Batch]:
    """Deterministic batches of `batch_size` samples in order of token length.

    Sorting by length keeps the padding, which every pass computes for nothing, small.
    `pad_id` only fills masked positions, so its value does not matter.
    """
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].ref_ids))
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        width = max(len(samples[i].ref_ids) for i in chunk)

        def padded(ids: list[int]) -> list[int]:
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

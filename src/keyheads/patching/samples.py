"""Prompt pairs prepared for patching: tokenised, validated and grouped by length.

Patching compares a reference prompt with its counterfactual position by position, so
both must have the same number of tokens; samples of equal length are batched together
so that no padding enters the computation (exactness is easy to reason about then).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from ..data.pairs import answer_continuation
from ..io import iter_jsonl
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
    """Read a pairs JSONL file (fields reference, counterfactual, answer) for patching."""
    samples = []
    tok = model.tokenizer
    for line, row in iter_jsonl(path):
        missing = [k for k in ("reference", "counterfactual", "answer") if k not in row]
        if missing:
            raise BadSample(f"{path}:{line}: missing field(s) {', '.join(missing)}; a pair needs "
                            "reference, counterfactual and answer")
        ref = tok(row["reference"])["input_ids"]
        cf = tok(row["counterfactual"])["input_ids"]
        if len(ref) != len(cf):
            raise BadSample(f"{path}:{line}: reference has {len(ref)} tokens but counterfactual has {len(cf)}; "
                            "patching needs aligned prompts of equal token length")
        # the answer's tokens as they follow the prompt (a lone "8" may tokenise differently)
        found = answer_continuation(tok, row["reference"], str(row["answer"]))
        if found is None:
            raise BadSample(f"{path}:{line}: the answer {row['answer']!r} does not start a token of its own "
                            "after the reference prompt")
        answer_id, _, n_answer = found
        if n_answer > 1 and not first_token_only:
            raise BadSample(f"{path}:{line}: the answer {row['answer']!r} is {n_answer} tokens; patching measures "
                            "one answer token (use single-token answers, or --first-token)")
        samples.append(PatchSample(line, ref, cf, answer_id))
        if limit is not None and len(samples) >= limit:
            break
    if not samples:
        raise BadSample(f"{path}: no pairs found")
    return samples


@dataclass
class Batch:
    """Samples of one length: [batch, pos] id tensors and the answer ids."""

    index: list[int]           # positions in the original sample list
    ref: torch.Tensor
    cf: torch.Tensor
    answer: torch.Tensor


def batches(samples: Sequence[PatchSample], batch_size: int, device) -> Iterator[Batch]:
    """Deterministic batches of equal-length samples, in order of first appearance."""
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        by_len.setdefault(len(s.ref_ids), []).append(i)
    for idx in by_len.values():
        for start in range(0, len(idx), batch_size):
            chunk = idx[start:start + batch_size]
            yield Batch(
                chunk,
                torch.tensor([samples[i].ref_ids for i in chunk], device=device),
                torch.tensor([samples[i].cf_ids for i in chunk], device=device),
                torch.tensor([samples[i].answer_id for i in chunk], device=device),
            )

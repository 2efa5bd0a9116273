"""What every analysis needs: the pairs file, answer tokens, END predictions, knockout subsets."""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..data import pairs as pairs_file
from ..errors import AnalysisError
from ..heads import Head
from ..knockout import Knockout
from ..models.model import HookedModel
from ..models.prompt_set import PromptSet


@dataclass
class Sample:
    """One reference prompt with what the analyses need to know about it.

    Fields: prompt (the reference text), answer (its text), answer_id (the first token of
    the answer as the model would write it after the prompt), task/template (groups),
    positions (role -> token index in the unpadded prompt, or None when the file has none),
    operands (name -> text) and counterfactual (the paired prompt, if any).
    """

    prompt: str
    answer: str
    answer_id: int
    task: str = "unknown"
    template: str = "unknown"
    positions: dict | None = None
    operands: dict | None = None
    counterfactual: str | None = None


def read_pair_rows(path: str | Path) -> list[dict]:
    """The pairs file as dicts (keyheads.data.pairs.read_pairs reads and validates every line)."""
    # read through the module, so that a test can watch every reader go through read_pairs
    return [p.to_dict() for p in pairs_file.read_pairs(path)]


def read_pair_list(path: str | Path) -> list[pairs_file.Pair]:
    """The pairs file, every line read and checked by keyheads.data.pairs.read_pairs."""
    # read through the module, so that a test can watch every reader go through read_pairs
    return pairs_file.read_pairs(path)


def answer_token(model: HookedModel, prompt: str, answer: str, join: str | None = None) -> tuple[str, int]:
    """(prompt, first answer token) as the model would continue `prompt` with `answer`.

    `join` goes between prompt and answer: by default a space unless the prompt already ends
    in whitespace ("3 + 5 =" + " 8"); pass "" to continue a number ("from 1723 to 172" + "8").
    If the tokenizer writes that space as a token of its own (SmolLM2, Llama), the space is
    moved into the prompt, so that the next token is the answer's first character. The
    answer must not merge with the prompt's last token.
    """
    answer = str(answer)
    if join is None:  # an answer written with its own leading space (" Paul") brings its join
        join = "" if prompt[-1:].isspace() or answer[:1].isspace() else " "
    ids_p = model.tokens(prompt, add_special_tokens=True)
    ids_full = model.tokens(prompt + join + answer, add_special_tokens=True)
    if len(ids_full) <= len(ids_p) or ids_full[:len(ids_p)] != ids_p:
        raise AnalysisError(f"the answer {answer!r} does not start a token of its own after {prompt[-40:]!r}")
    first = ids_full[len(ids_p)]
    if join and model.tokenizer.decode([first]).strip() == "":
        return answer_token(model, prompt + join, answer, join="")
    return prompt, first


def number_token(model: HookedModel, text: str) -> int:
    """The first non-space token of a number written after a space (W_U row used for probes)."""
    ids = model.tokens(" " + str(text))
    for i in ids:
        if model.tokenizer.decode([i]).strip():
            return i
    raise AnalysisError(f"{text!r} has no non-space token")


def load_samples(model: HookedModel, path: str | Path, n: int | None = None, seed: int = 0) -> list[Sample]:
    """Reference samples from a pairs file, a seeded subset of `n` when n is smaller (file order kept)."""
    pairs = read_pair_list(path)
    if n is not None and 0 < n < len(pairs):
        keep = sorted(random.Random(seed).sample(range(len(pairs)), n))
        pairs = [pairs[i] for i in keep]
    samples = []
    for pair in pairs:
        # a space token may be appended to the prompt; positions index the same tokens as before
        prompt, tok = answer_token(model, pair.reference, pair.answer)
        samples.append(Sample(prompt, pair.answer, tok, pair.task or "unknown", pair.template or "unknown",
                              pair.positions or None, pair.operands or None, pair.counterfactual))
    return samples


# ---- END predictions ---------------------------------------------------------------------

@dataclass
class Predictions:
    """END-position predictions: top-1 ids, the answer's probability, optional top-k."""

    top1: torch.Tensor
    p_answer: torch.Tensor
    topk_ids: torch.Tensor | None = None
    topk_probs: torch.Tensor | None = None

    def correct(self, answer_ids: Sequence[int]) -> torch.Tensor:
        return self.top1 == torch.as_tensor(list(answer_ids))

    def accuracy(self, answer_ids: Sequence[int]) -> float:
        return self.correct(answer_ids).float().mean().item() if len(answer_ids) else float("nan")


# ---- knockout ----------------------------------------------------------------------------

def all_heads(model: HookedModel) -> list[Head]:
    return [Head(l, h) for l in range(model.n_layers) for h in range(model.n_heads)]


def knockout_subset(full: Knockout, heads: Sequence[Head]) -> Knockout:
    """A Knockout of `heads` that shares the means already computed for all candidate heads."""
    missing = [h for h in heads if h[0] not in full.head_means]
    if missing:
        raise AnalysisError(f"no means computed for heads {', '.join(map(str, missing))}")
    return Knockout(heads=list(heads), mlps=[], head_means=full.head_means, head_global=full.head_global,
                    mean=full.mean)


@dataclass
class FallbackNote:
    """How many prompts reached past the END-aligned means (their first tokens got the global mean)."""

    n_prompts: int
    n_longer: int
    aligned_len: int
    mean: str
    cf_lengths: list[int] = field(default_factory=list)

    @property
    def used(self) -> bool:
        return self.mean == "global" or self.n_longer > 0

    def text(self, what: str = "prompts") -> str:
        if self.mean == "global":
            return "knockout used the mean over all positions (the global mean) for every position"
        if not self.n_longer:
            return ""
        return (f"fallback: {self.n_longer}/{self.n_prompts} {what} are longer than the {self.aligned_len} "
                f"END-aligned counterfactual positions; their earlier positions used the global mean")


def fallback_note(full: Knockout, prompts: PromptSet) -> FallbackNote:
    return FallbackNote(prompts.n, prompts.longer_than(full.max_len), full.max_len, full.mean)


def alignment_warning(model: HookedModel, cf_prompts: Sequence[str]) -> str:
    """Per-position means only mean one thing per position if all counterfactual prompts align at END."""
    lengths = sorted({len(model.tokens(p, add_special_tokens=True)) for p in cf_prompts})
    if len(lengths) <= 1:
        return ""
    return (f"counterfactual prompts have {len(lengths)} different lengths ({lengths[0]}..{lengths[-1]} tokens): "
            "END-aligned per-position means mix different templates' tokens at the same offset "
            "(positions beyond the shortest are averaged over fewer prompts); pass --mean global "
            "to use one mean over all positions instead")

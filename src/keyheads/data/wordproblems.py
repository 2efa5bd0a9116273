"""Counterfactuals for GSM8K-style word problems (appendix E of the paper), and the pairs made of them.

The phrase that asks for the calculation is replaced with one that asks for nothing computable,
changing as little text as possible:

    "... 50% is already busy. Calculate the number of gigabytes still available."
    "... 50% is already busy. Describe the location of gigabytes still available."

A pair's prompts end where the answer starts (PROMPT), so that patching measures the logit of the
answer's first token, as on the arithmetic pairs.
"""
from __future__ import annotations

import random
import re
from collections import Counter

from ..errors import NothingCorrect, UserError
from ..log import logger
from ..numbers import format_number
from .benchmarks import Record
from .generate import Candidate, correct_ones, prompt_end
from .pairs import Pair
from .settings import WORD_PROBLEMS, PairSettings

PROMPT = "Q: {question}\nA: The answer is "

# (phrase, replacements in order of preference). The replacements keep the grammar roughly intact
# and usually the token count; with a tokenizer the first one that keeps it exactly is used.
PHRASES: list[tuple[str, list[str]]] = [
    ("Calculate the number", ["Describe the location"]),
    ("Calculate the total", ["Describe the colour", "Describe the location"]),
    ("Calculate the", ["Describe the"]),
    ("calculate the", ["describe the"]),
    ("Calculate", ["Describe"]),
    ("calculate", ["describe"]),
    ("Compute the", ["Describe the"]),
    ("compute the", ["describe the"]),
    ("Find the total", ["Describe the colour", "Describe the location"]),
    ("Find the number", ["Describe the location"]),
    ("What is the total", ["What is the colour", "What is the location"]),
    ("What was the total", ["What was the colour", "What was the location"]),
    ("What is the sum", ["What is the colour"]),
    ("What is the average", ["What is the colour"]),
    ("What is the difference", ["What is the location"]),
    ("What percentage", ["What colour"]),
    ("What percent", ["What colour"]),
    ("How many", ["How come", "Which"]),
    ("how many", ["how come", "which"]),
    ("How much", ["How come", "Which"]),
    ("how much", ["how come", "which"]),
    ("How long", ["How come"]),
    ("how long", ["how come"]),
    ("How old", ["How come"]),
    ("How far", ["How come"]),
]


def question_pair(question: str, tokenizer=None) -> tuple[str, str] | None:
    """(reference, counterfactual) for a word problem, or None when no known phrase matches.

    The last matching phrase is replaced (the question is usually the final sentence); at the same
    place the longest phrase wins. With a tokenizer, only a replacement that keeps the token count
    is used (None if there is none), so that reference and counterfactual align.
    """
    best = None
    for phrase, replacements in PHRASES:
        for m in re.finditer(rf"(?<![A-Za-z]){re.escape(phrase)}(?![A-Za-z])", question):
            key = (m.start(), len(phrase))
            if best is None or key > best[0]:
                best = (key, m, replacements)
    if best is None:
        return None
    _, m, replacements = best
    for new in replacements:
        counterfactual = question[:m.start()] + new + question[m.end():]
        if tokenizer is None or _n_tokens(tokenizer, counterfactual) == _n_tokens(tokenizer, question):
            return question, counterfactual
    return None


def _n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=True)["input_ids"])


def word_problem_pairs(model, records: list[Record], config: PairSettings, name: str = WORD_PROBLEMS,
                       batch_size: int = 32,
                       log=logger.info, progress: bool = True) -> list[Pair]:
    """Pairs from up to config.n of `records` (a seeded order: config.seed), the questions with a phrase to
    replace; with config.keep_correct only those `model` answers right (NothingCorrect when none)."""
    rejected: Counter = Counter()
    candidates: list[Candidate] = []
    for record in random.Random(f"{config.seed}:{name}").sample(records, len(records)):
        if len(candidates) == config.n:
            break
        candidate = _candidate(model.tokenizer, record, config, name, rejected)
        if candidate is not None:
            candidates.append(candidate)
    log(f"{name}: {len(candidates)} pairs from {sum(rejected.values()) + len(candidates)} questions"
        + ("; rejected: " + ", ".join(f"{why} ({n})" for why, n in rejected.items()) if rejected else ""))
    if not candidates:
        raise UserError(f"{name}: no question of the {len(records)} gave a pair (rejected: "
                        + ", ".join(f"{why} ({n})" for why, n in rejected.items()) + ")")
    if not config.keep_correct:
        return [c.pair for c in candidates]
    kept, _ = correct_ones(model, name, candidates, batch_size, log, progress)
    if not kept:
        raise NothingCorrect(f"the model answered none of the {len(candidates)} {name} prompts correctly, so "
                             "keep_correct keeps nothing")
    return kept


def _candidate(tokenizer, record: Record, config: PairSettings, name: str, rejected: Counter) -> Candidate | None:
    """The pair of one word problem, or None (counted in `rejected`)."""
    found = question_pair(record.question, tokenizer)
    if found is None:
        rejected["no phrase to replace with one of the same token count"] += 1
        return None
    reference, counterfactual = (PROMPT.format(question=q) for q in found)
    answer = format_number(record.numeric_answer())
    end = prompt_end(tokenizer, "", reference, answer)
    if end is None:
        rejected["answer does not start a token of its own"] += 1
        return None
    stem, (answer_token, _, n_answer) = end
    if config.single_token_answer and n_answer != 1:
        rejected["answer is several tokens"] += 1
        return None
    counterfactual = counterfactual[:len(counterfactual) - (len(reference) - len(stem))]
    n_tokens = _n_tokens(tokenizer, stem)
    if _n_tokens(tokenizer, counterfactual) != n_tokens:  # the prompt's ending may join the question's last word
        rejected["counterfactual prompt has another token count"] += 1
        return None
    return Candidate(Pair(stem, counterfactual, answer, name, name), answer_token, n_tokens)

"""Few-shot prompts: chain-of-thought math from GSM8K train, MMLU and CommonsenseQA multiple choice."""
from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..data.benchmarks import LETTERS, Record
from ..errors import SettingError, UserError
from ..numbers import format_number
from .extract import NUMBER

T = TypeVar("T")  # what pick chooses among: records, or generated arith items

STOPS = ("\n\n", "Question:")  # the model starts the next exemplar: its answer is over


def pick(records: Sequence[T], k: int, seed: int) -> list[T]:
    """k records chosen by a seeded sample, in a fixed order (the same prompt on every machine)."""
    if k <= 0:
        return []
    if k > len(records):
        raise SettingError(f"asked for {k} few-shot exemplars but only {len(records)} are available: "
                           "ask for fewer (--few-shot)")
    index = sorted(random.Random(seed).sample(range(len(records)), k))
    return [records[i] for i in index]


def pick_balanced(records: Sequence[Record], k: int, seed: int) -> list[Record]:
    """Like `pick`, but the exemplars' answer letters cycle A, B, C, ... so the prompt does not
    teach a letter bias (a plain sample can come out all "A")."""
    if k <= 0:
        return []
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_choices = max(len(r.choices) for r in records)
    chosen: list[Record] = []
    for want in (i % n_choices for i in range(k)):
        match = next((records[j] for j in order if records[j].label == want and records[j] not in chosen), None)
        if match is None:
            raise UserError(f"no exemplar with answer {LETTERS[want]} left to pick: ask for fewer (--few-shot)")
        chosen.append(match)
    random.Random(seed + 1).shuffle(chosen)  # and no A, B, C, ... pattern to continue
    return chosen


# ---- math --------------------------------------------------------------------------------------

def math_answer(record: Record, cot: bool) -> str:
    """The exemplar answer: the GSM8K rationale on one line, then "The answer is N."."""
    final = f"The answer is {format_number(record.numeric_answer())}."
    if cot and record.solution:
        return " ".join(record.solution.split()) + " " + final
    return final


def math_prompt(question: str, exemplars: Sequence[Record], cot: bool = True) -> str:
    shots = "".join(f"Question: {e.question}\nAnswer: {math_answer(e, cot)}\n\n" for e in exemplars)
    return shots + f"Question: {question}\nAnswer:"


# "The answer is 42." followed by anything that cannot continue the number: the answer is complete.
_DONE = re.compile(r"the answer is\s*:?\s*\$?\s*" + NUMBER + r"(?=\.?[^\d.,]|,\D)", re.IGNORECASE)


def cut_at_stop(text: str, stops: Sequence[str] = STOPS) -> int | None:
    """Index where the answer ends, or None to keep generating.

    The answer ends at the first stop string (the model starts a new exemplar) or right
    after the first complete "The answer is N" (small models tend to repeat it forever).
    """
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    done = _DONE.search(text)
    if done:
        end = done.end()
        cuts.append(end + 1 if text[end:end + 1] == "." else end)
    return min(cuts) if cuts else None


# ---- multiple choice ---------------------------------------------------------------------------

def choice_block(record: Record, with_answer: bool) -> str:
    options = "".join(f"{LETTERS[i]}. {c}\n" for i, c in enumerate(record.choices))
    answer = f" {record.letter}\n\n" if with_answer else ""
    return f"{record.question}\n{options}Answer:{answer}"


def choice_header(record: Record) -> str:
    topic = record.subject.replace("_", " ") if record.subject else "common sense"
    return f"The following are multiple choice questions (with answers) about {topic}.\n\n"


def choice_prompt(record: Record, exemplars: Sequence[Record]) -> str:
    """The MMLU prompt of Hendrycks et al.; CommonsenseQA uses the same layout with five options."""
    return choice_header(record) + "".join(choice_block(e, True) for e in exemplars) + choice_block(record, False)


@dataclass(frozen=True)
class LetterTokens:
    """How answer letters look to the model after "Answer:".

    Attributes:
        extra: token ids to append after the prompt before the letter (the space, for
            tokenizers that make it a token of its own), usually empty.
        letters: the token id of each letter ("ĠA" for GPT-2/Llama-3 style BPE, "▁A" for
            SentencePiece), in the order A, B, C, ...
    """

    extra: tuple[int, ...]
    letters: tuple[int, ...]


def letter_tokens(tokenizer, n: int, stem: str = "Question?\nAnswer:") -> LetterTokens:
    """Tokenise "Answer: A" in context and see what follows the tokens of "Answer:"."""
    base = tokenizer(stem, add_special_tokens=False)["input_ids"]
    tails = []
    for letter in LETTERS[:n]:
        full = tokenizer(f"{stem} {letter}", add_special_tokens=False)["input_ids"]
        if full[:len(base)] != base:
            raise UserError(f"the tokenizer merges 'Answer:' with the letter {letter!r}; this model cannot score "
                            "multiple-choice letters (leave out mmlu and csqa)")
        tails.append(full[len(base):])
    if all(len(t) == 1 for t in tails):
        extra: tuple[int, ...] = ()
    elif all(len(t) == 2 for t in tails) and len({t[0] for t in tails}) == 1:
        extra = (tails[0][0],)  # the space is its own token: feed it, then read the letter
    else:
        raise UserError(f"unexpected tokenisation of the answer letters: {tails}; this model cannot score "
                        "multiple-choice letters (leave out mmlu and csqa)")
    letters = tuple(t[-1] for t in tails)
    if len(set(letters)) != n:
        raise UserError(f"answer letters do not map to distinct tokens: {tails}; this model cannot score "
                        "multiple-choice letters (leave out mmlu and csqa)")
    return LetterTokens(extra, letters)


def round_robin(records: list[Record]) -> list[Record]:
    """Subject by subject interleaving: question 0 of every subject, then question 1, ..."""
    by_subject: dict[str | None, list[Record]] = {}
    for r in records:
        by_subject.setdefault(r.subject, []).append(r)
    out: list[Record] = []
    depth = max(len(v) for v in by_subject.values())
    for i in range(depth):
        out.extend(v[i] for v in by_subject.values() if i < len(v))
    return out

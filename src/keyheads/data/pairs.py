"""Reference / counterfactual prompt pairs, the input of every analysis.

A reference prompt X_r asks for a calculation ("3 + 5 = "), its counterfactual X_c has the same
structure and token count but no calculation logic ("3 @ 5 = "): the operator is replaced by a
nonsense word or symbol. Files are JSONL, one pair a line:

    {"task": "addition", "template": "add-eq-1", "reference": "3 + 5 = ", "counterfactual": "3 @ 5 = ",
     "answer": "8", "operands": {"A": "3", "B": "5"}, "positions": {"A": 0, "B": 3, "operator": 1}}

`positions` index the tokenized prompt as the tokenizer returns it with special tokens (BOS...) and
any few-shot prefix, i.e. unpadded: a left-padded batch shifts them by the padding. The answer token
is the first token of the answer after the prompt (`answer_token_id`); tokenizers that put the space
before a number in a token of its own get prompts ending with that space, so that the next token is
the digit.

This module is the contract (format, reading, alignment checks); generate.py makes pairs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BadSample, NoPairs
from ..io import MalformedLine, iter_jsonl, write_jsonl
from .templates import OPERANDS

POSITION_KEYS = ("A", "B", "operator")
REQUIRED = ("reference", "counterfactual", "answer")
OPTIONAL = ("task", "template", "operands", "positions")


# ---- the file format ----------------------------------------------------------------------------
@dataclass
class Pair:
    """One reference / counterfactual pair.

    reference, counterfactual: the prompts, ending where the answer starts (same token count).
    answer: the correct answer as text, e.g. "8"; the model should predict its first token.
    task, template: where it came from (None when read from a minimal file).
    operands: {"A": "3", "B": "5"}.
    positions: token index of operand A, operand B and the operator in both prompts (the last token
        of each when it spans several), or None when unknown.
    line: the line of the file it was read from (for error messages; not part of the pair).
    """

    reference: str
    counterfactual: str
    answer: str
    task: str | None = None
    template: str | None = None
    operands: dict[str, str] | None = None
    positions: dict[str, int] | None = None
    line: int | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict:
        return {"task": self.task, "template": self.template, "reference": self.reference,
                "counterfactual": self.counterfactual, "answer": self.answer,
                "operands": self.operands, "positions": self.positions}


def write_pairs(path: str | Path, pairs) -> Path:
    """Write pairs as JSONL, atomically: a crash leaves the old file or the new one, never half."""
    return write_jsonl(path, (p.to_dict() for p in pairs))


def read_pairs(path: str | Path) -> list[Pair]:
    """Read and check a pairs file: the one reader of the format (analyses, patching and the
    knockout variant of the evaluation all come here).

    Only reference, counterfactual and answer are required (a numeric answer becomes its text); a
    malformed line raises MalformedLine naming the file, the line number and the field; a file
    without pairs raises NoPairs. Each Pair keeps its line number in `line`.
    """
    pairs = []
    for number, obj in iter_jsonl(path):
        def bad(why: str, number: int = number) -> MalformedLine:
            return MalformedLine(f"{path}:{number}: {why}")

        missing = [key for key in REQUIRED if key not in obj]
        if missing:
            raise bad(f"missing {', '.join(missing)} (a pair needs {', '.join(REQUIRED)})")
        obj = dict.fromkeys(OPTIONAL) | obj  # an optional field left out is null
        for key in ("reference", "counterfactual"):
            if not isinstance(obj[key], str) or not obj[key]:
                raise bad(f"`{key}` must be a non-empty string")
        answer = obj["answer"]
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str) or not answer.strip():
            raise bad("`answer` must be a non-empty string")
        for key in ("task", "template"):
            if obj[key] is not None and not isinstance(obj[key], str):
                raise bad(f"`{key}` must be a string")
        operands = obj["operands"]
        if operands is not None:
            if not isinstance(operands, dict):
                raise bad("`operands` must be an object")
            operands = {str(k): str(v) for k, v in operands.items()}
        positions = obj["positions"]
        if positions is not None:
            if not isinstance(positions, dict) or any(k not in positions for k in POSITION_KEYS):
                raise bad(f"`positions` must be an object with {', '.join(POSITION_KEYS)}")
            if not all(isinstance(positions[k], int) and not isinstance(positions[k], bool)
                       and positions[k] >= 0 for k in POSITION_KEYS):
                raise bad("`positions` values must be non-negative integers")
            positions = {k: positions[k] for k in POSITION_KEYS}
        pairs.append(Pair(obj["reference"], obj["counterfactual"], answer, obj["task"], obj["template"], operands,
                          positions, line=number))
    if not pairs:
        raise NoPairs(f"{path}: no pairs in the file (one JSON object a line, with {', '.join(REQUIRED)})")
    return pairs


# ---- tokenizer helpers --------------------------------------------------------------------------
def encode_with_offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids with special tokens, and each token's character span (special tokens: empty)."""
    enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def span_tokens(offsets, start: int, end: int) -> list[int]:
    """Indices of the tokens that overlap characters [start, end)."""
    return [i for i, (s, e) in enumerate(offsets) if e > s and s < end and e > start]


def answer_continuation(tokenizer, prompt: str, answer: str) -> tuple[int, str, int] | None:
    """(first answer token, full text, answer token count) when `answer` follows `prompt` without
    changing the prompt's tokens.

    A prompt not ending in whitespace is first tried with a space before the answer (" 8" as in
    "3 + 5 = 8"), then without ("153" + "7" in "the year 1537"). An answer written with its own leading
    space (" Paul", as lm-eval and Hugging Face targets write it) follows the prompt as it is.
    """
    ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    joins = [""] if prompt[-1:].isspace() or answer[:1].isspace() else [" ", ""]
    answer_text = answer.strip()
    for join in joins:
        full = prompt + join + answer
        full_ids = tokenizer(full, add_special_tokens=True)["input_ids"]
        if len(full_ids) <= len(ids) or list(full_ids[:len(ids)]) != list(ids):
            continue
        token = full_ids[len(ids)]
        piece = tokenizer.decode([token]).strip()
        if piece and answer_text.startswith(piece):
            return token, full, len(full_ids) - len(ids)
    return None


def answer_token_id(tokenizer, prompt: str, answer: str) -> int:
    """The token a model must predict after `prompt`: the first token of the answer."""
    found = answer_continuation(tokenizer, prompt, answer)
    if found is None:
        raise BadSample(f"the answer {answer!r} does not start a token of its own after {prompt!r}")
    return found[0]


def verify_pair(tokenizer, pair: Pair) -> list[str]:
    """What is wrong with a pair for this tokenizer (empty when it is aligned and positions point
    at the operands and the operator)."""
    problems = []
    ref_ids, ref_off = encode_with_offsets(tokenizer, pair.reference)
    cf_ids, _ = encode_with_offsets(tokenizer, pair.counterfactual)
    if len(ref_ids) != len(cf_ids):
        problems.append(f"reference has {len(ref_ids)} tokens, counterfactual {len(cf_ids)}")
    if answer_continuation(tokenizer, pair.reference, pair.answer) is None:
        problems.append(f"answer {pair.answer!r} does not start a token after the reference")
    if pair.positions is None:
        return problems
    for key in POSITION_KEYS:
        if not 0 <= pair.positions[key] < len(ref_ids):
            problems.append(f"position {key}={pair.positions[key]} outside the {len(ref_ids)} tokens")
    if problems:
        return problems
    if len(cf_ids) == len(ref_ids):
        for key in OPERANDS:  # operands are the same tokens in both prompts, the operator is not
            if ref_ids[pair.positions[key]] != cf_ids[pair.positions[key]]:
                problems.append(f"operand {key} differs between reference and counterfactual")
        if ref_ids[pair.positions["operator"]] == cf_ids[pair.positions["operator"]]:
            problems.append("the operator token is the same in reference and counterfactual")
    operands = pair.operands or {}
    for key in OPERANDS if operands else ():
        s, e = ref_off[pair.positions[key]]
        token, operand = pair.reference[s:e].strip(), operands[key]
        # a single-token operand is that token; a multi-token one ends with it
        if not token or not operand.endswith(token):
            problems.append(f"position {key} points at {pair.reference[s:e]!r}, not at operand {operand!r}")
    return problems

"""Counterfactuals for GSM8K-style word problems (appendix E of the paper).

The phrase that asks for the calculation is replaced with one that asks for nothing computable,
changing as little text as possible:

    "... 50% is already busy. Calculate the number of gigabytes still available."
    "... 50% is already busy. Describe the location of gigabytes still available."
"""
from __future__ import annotations

import re

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

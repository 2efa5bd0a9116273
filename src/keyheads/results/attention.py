"""attention.json: where the key heads look from the END token, by token role (figure 5), and each head's label.

A head's label is the role it attends to most (operand, operator or text), its lean the larger of operand and
operator (keyheads.analysis.attention computes both).
"""
from __future__ import annotations

from .base import HeadField, Result


class HeadLabel(Result):
    """One head's mean END attention by token role, summed over the prompts' tokens of that role."""

    head: HeadField
    label: str
    lean: str
    operand_A_plus_B: float
    operator: float
    other_words: float
    first_token: float
    top_other_tokens: list[tuple[str, float]] = []  # the most-attended tokens of no role, with their attention


class HeadEffect(Result):
    """A key head's path-patching effect, beside its attention."""

    layer: int
    head: int
    effect: float


class AttentionResult(Result):
    model: str
    data: str
    n_samples: int
    heads: list[HeadField]
    roles: list[str]
    per_task: dict[str, list[list[float]]]  # task -> [head][role] mean attention
    counts: dict[str, int]  # prompts per task
    all: list[list[float]]  # [head][role] over every prompt
    labels: list[HeadLabel]
    effects: list[HeadEffect] | None  # None: no effects file was given
    notes: list[str]

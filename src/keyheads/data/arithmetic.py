"""Arithmetic rules: operands a task allows, answers and how they are written.

`compute_answer` takes the rules of a PairSettings (anything with allow_negative and
allow_fractions); `draw_operands` also its operand ranges (a_range, b_range).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import cast

from .templates import Template


@dataclass(frozen=True)
class AnswerRules:
    """Which answers a task may have: the default allows neither negative nor fractional ones."""

    allow_negative: bool = False
    allow_fractions: bool = False


EXACT = AnswerRules()


def compute_answer(task: str, a: int | Decimal, b: int | Decimal, config: AnswerRules = EXACT):
    """The answer as a number, or None when the task's rules exclude these operands."""
    if task == "addition":
        return a + b
    if task == "subtraction":
        return a - b if a >= b or config.allow_negative else None
    if task == "multiplication":
        return a * b
    if task == "division":
        if b == 0:
            return None
        q = Fraction(a) / Fraction(b)
        return q if q.denominator == 1 or config.allow_fractions else None
    if task == "exponentiation":
        return a ** b
    raise ValueError(f"unknown task {task!r}")


def format_answer(value) -> str:
    if isinstance(value, Fraction):
        if value.denominator == 1:
            return str(value.numerator)
        return f"{float(value):.2f}".rstrip("0").rstrip(".")
    return str(value)


def draw_operands(template: Template, config, rng: random.Random, tries: int = 10_000):
    """(A, B, answer text) uniform over the operand pairs the task and template allow, or None."""
    for _ in range(tries):
        a, b = rng.randint(*config.a_range), rng.randint(*config.b_range)
        value = compute_answer(template.task, a, b, config)
        if value is not None and (template.max_answer is None or value <= template.max_answer):
            return str(a), str(b), format_answer(value)
    return None


@dataclass(frozen=True)
class NumberRange:
    """The numbers lo..hi (both included) in steps of the last decimal place of `lo`, each written
    with that many decimals: NumberRange("100", "999") is 100, 101, ..., 999; NumberRange("1.1", "9.9")
    is 1.1, 1.2, ..., 9.9. Declared rather than drawn by ad-hoc code, so that whether two ranges can
    share a number (a training set and a held-out one) is a comparison of bounds."""

    lo: str
    hi: str

    @property
    def decimals(self) -> int:
        return max(0, -cast(int, Decimal(self.lo).as_tuple().exponent))  # an int for every finite number

    def draw(self, rng: random.Random) -> str:
        d = self.decimals
        return str(Decimal(rng.randint(int(Decimal(self.lo).scaleb(d)), int(Decimal(self.hi).scaleb(d)))).scaleb(-d))

    @property
    def ranges(self) -> tuple[NumberRange, ...]:
        return (self,)

    def draw_pair(self, rng: random.Random) -> tuple[str, str]:
        return self.draw(rng), self.draw(rng)

    def overlaps(self, other: NumberRange | EitherOrder) -> bool:
        """Whether some number lies in this range and in `other` (in either of an EitherOrder's ranges)."""
        return any(Decimal(self.lo) <= Decimal(o.hi) and Decimal(o.lo) <= Decimal(self.hi) for o in other.ranges)

    def __contains__(self, text: str) -> bool:
        return Decimal(self.lo) <= Decimal(text) <= Decimal(self.hi)

    def __str__(self) -> str:
        return f"{self.lo}..{self.hi}"


@dataclass(frozen=True)
class EitherOrder:
    """One operand from `first` and the other from `second`, which comes first decided by a coin:
    EitherOrder(NumberRange("100", "999"), NumberRange("2", "9")) gives 345 x 7 and 7 x 345."""

    first: NumberRange
    second: NumberRange

    @property
    def ranges(self) -> tuple[NumberRange, ...]:
        return (self.first, self.second)

    def draw_pair(self, rng: random.Random) -> tuple[str, str]:
        a, b = self.first.draw(rng), self.second.draw(rng)
        return (a, b) if rng.random() < 0.5 else (b, a)

    def __str__(self) -> str:
        return f"{self.first} with {self.second}"


def draw_exact(task: str, operands: NumberRange | EitherOrder, rng: random.Random) -> tuple[str, str, str]:
    """(A, B, answer) with the operands from `operands` and the answer in exact decimal arithmetic
    (no float noise in "0.1 + 0.2"); a subtraction that would go negative swaps A and B."""
    a, b = operands.draw_pair(rng)
    value = compute_answer(task, Decimal(a), Decimal(b))
    if value is None:
        a, b = b, a
        value = compute_answer(task, Decimal(a), Decimal(b))
    return a, b, format_answer(value)


ARITH_KINDS: dict[str, tuple[tuple[str, ...], NumberRange | EitherOrder]] = {
    # kind -> (tasks, operand range) of `--train arith:KINDS`: operands outside the one-digit range the
    # analysis uses. The held-out `arith-*` evaluation sets (keyheads.evaluation.arith) check that they
    # draw none of these.
    "multidigit": (("addition", "subtraction"), NumberRange("100", "999")),
    "decimal": (("addition", "subtraction"), NumberRange("1.1", "9.9")),
    # Harder kinds, for a model that already solves two-digit sums: five-digit sums and differences
    # (held out: arith-add4's four digits), and three-digit by one-digit products in both orders
    # (held out: arith-mul's two by two digits, whose partial products are of another shape).
    "fivedigit": (("addition", "subtraction"), NumberRange("10000", "99999")),
    "multiply": (("multiplication",), EitherOrder(NumberRange("100", "999"), NumberRange("2", "9"))),
}

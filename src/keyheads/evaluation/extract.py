"""Reading the number out of a generated answer, comparing numbers, and confidence intervals."""
from __future__ import annotations

import math
import re

# A number: thousands with commas (1,234,567.5), or plain digits (1234.5, .5); optional minus.
NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(NUMBER)
# "The answer is $1,234." / "#### 72" / "The answer is: -3"; the first number after the phrase.
_MARKED_RE = re.compile(r"(?:the answer is|####)\s*:?\s*\$?\s*(" + NUMBER + ")", re.IGNORECASE)


def to_float(text: str) -> float:
    return float(text.replace(",", ""))


def extract_answer(text: str) -> tuple[float | None, str | None, str]:
    """-> (value, matched text, how) with how in {"marked", "last", "none"}.

    The number after "The answer is" or "####" wins (the last such mark, since a model may
    restate); otherwise the last number in the text; otherwise None.
    """
    marked = list(_MARKED_RE.finditer(text))
    if marked:
        found = marked[-1].group(1)
        return to_float(found), found, "marked"
    numbers = _NUMBER_RE.findall(text)
    if numbers:
        return to_float(numbers[-1]), numbers[-1], "last"
    return None, None, "none"


def extract_first(text: str) -> tuple[float | None, str | None, str]:
    """-> (value, matched text, how) with how in {"first", "none"}: the first number in the text.

    For prompts whose answer is a bare number (the arith sets): what follows it is the model
    going on, not a restatement, so the first number is the answer.
    """
    found = _NUMBER_RE.search(text)
    if found:
        return to_float(found.group()), found.group(), "first"
    return None, None, "none"


def decimals(text: str | None) -> int:
    if not text or "." not in text:
        return 0
    return len(text.split(".", 1)[1])


def numbers_match(pred: float | None, gold: float, pred_text: str | None = None, min_decimals: int = 2) -> bool:
    """Numeric equality with a tolerance for decimals.

    Exact up to float noise; and a prediction written with at least `min_decimals`
    decimals counts when the gold answer rounds to it (gold 1.8333..., "1.83" is right),
    because the data's non-integer answers are often repeating decimals.
    """
    if pred is None or math.isnan(pred):
        return False
    if math.isclose(pred, gold, rel_tol=1e-6, abs_tol=1e-6):
        return True
    d = decimals(pred_text)
    return d >= min_decimals and math.isclose(round(gold, d), pred, abs_tol=10 ** -(d + 3))


def wilson(correct: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion (stays inside [0, 1], exactly 0 or 1 at 0 and n)."""
    if n == 0:  # no items: nothing is known (scipy refuses n = 0)
        return 0.0, 1.0
    from scipy import stats  # noqa: PLC0415 -- loaded on use, see pyproject

    ci = stats.binomtest(correct, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)

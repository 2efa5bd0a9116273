"""How numbers are written for people: an answer after "The answer is", and a count of parameters."""
from __future__ import annotations

import math
from typing import Any


def format_number(value: float) -> str:
    """51.0 -> '51', 2.5 -> '2.5' (how an answer is written after 'The answer is')."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def human(n: Any) -> str:
    """1234567 -> '1.23M', 950 -> '950'; anything that is not a number (None, NaN) -> '–'."""
    if not isinstance(n, (int, float)) or isinstance(n, bool) or math.isnan(n):
        return "–"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(int(n))

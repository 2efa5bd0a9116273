"""Rendering a template: its text with values filled in, and where each slot landed."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from .templates import OPERANDS, Slot, Template


@dataclass
class Rendered:
    text: str                                   # the prompt stem: the template text before {C}
    spans: dict[str, tuple[int, int]]           # "A", "B", "operator" -> character span
    changed: list[tuple[int, int]] = field(default_factory=list)  # spans a counterfactual replaces


def render(template: Template, values: dict[str, str], op_word: str | None = None,
           swaps: dict[int, str] | None = None) -> Rendered:
    """Fill a template. `op_word` and `swaps` (part index -> value for ~ slots) make a counterfactual."""
    out, spans, changed, n = [], {}, [], 0
    for i, part in enumerate(template.parts[:-1]):  # the last part is {C}
        if isinstance(part, str):
            piece = part
        elif part.name == "OP":
            piece = op_word if op_word is not None else part.word
        elif swaps is not None and i in swaps:
            piece = swaps[i]
        else:
            piece = values[part.name]
        if isinstance(part, Slot):
            span = (n, n + len(piece))
            if part.name in OPERANDS:
                spans[part.name] = span
            elif part.name == "OP":
                spans["operator"] = span
            if part.name == "OP" or part.resample:
                changed.append(span)
        out.append(piece)
        n += len(piece)
    return Rendered("".join(out), spans, changed)


def draw_fillers(template: Template, pools: dict, rng: random.Random) -> dict[str, str]:
    """One value per filler slot; slots sharing a pool (NAME, NAME2) get different values."""
    values: dict[str, str] = {}
    taken: dict[str, set[str]] = {}  # pool -> values drawn from it
    for name in template.fillers:
        pool = template.pool_of[name]
        used = taken.setdefault(pool, set())
        choices = [v for v in pools[pool] if v not in used] or pools[pool]
        values[name] = rng.choice(choices)
        used.add(values[name])
    return values


def left_context(parts, index: int, values: dict) -> str:
    """The character before slot `index` as rendered (a space changes how BPE tokenizes a word)."""
    if index == 0:
        return ""
    prev = parts[index - 1]
    prev = prev if isinstance(prev, str) else (prev.word if prev.name == "OP" else values.get(prev.name, ""))
    return prev[-1:] if prev[-1:].isspace() else ""

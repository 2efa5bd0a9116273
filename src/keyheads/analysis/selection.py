"""Which heads an analysis command works on, and the notes a run collects."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..components import Components
from ..effects import Effects
from ..heads import Head
from ..log import logger
from ..models.model import HookedModel
from .common import (
    AnalysisError,
)


class Notes(list):
    """Warnings and remarks: printed when they happen and kept for the run's JSON."""

    def add(self, text: str) -> None:
        if text:
            logger.warning("note: %s", text)
            self.append(text)




@dataclass
class Selection:
    """How key heads are chosen: explicit `heads` win; else `Components.select` over `effects` (an
    effects.json path) with `threshold` and `top_k` (neither: the paper's -5%)."""

    heads: tuple[Head, ...] = ()
    effects: str | None = None
    threshold: float | None = None
    top_k: int | None = None


def choose_heads(model: HookedModel, sel: Selection) -> tuple[list[Head], Effects | None]:
    """(key heads, Effects or None)."""
    effects = Effects.load(sel.effects, model) if sel.effects else None
    if sel.heads:
        return list(Components(tuple(sel.heads)).check(model.n_layers, model.n_heads).heads), effects
    if effects is None or sel.effects is None:
        raise AnalysisError("say which heads: --effects effects.json (from `keyheads patch`) or --heads L.H,...")
    return list(Components.select(effects, sel.threshold, sel.top_k, name=Path(sel.effects).name).heads), effects

"""Which heads a step works on (one settings type for every command, stage and variant), and the notes a
run collects."""
from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict, Field, field_validator
from pydantic.dataclasses import dataclass

from ..components import Components
from ..effects import Effects
from ..errors import AnalysisError, SettingError
from ..heads import Head, parse_heads
from ..io import existing_file
from ..log import logger
from ..models.model import HookedModel


class Notes(list):
    """Warnings and remarks: logged when they happen and kept for the run's JSON."""

    def add(self, text: str) -> None:
        if text:
            logger.warning("note: %s", text)
            self.append(text)


def effects_file(path: str | None, key: str = "effects") -> str | None:
    """An effects.json that exists and reads as one: a truncated or foreign file fails before any model loads."""
    if existing_file(key, path, "it is written by `keyheads patch`") is not None:
        Effects.load(path)
    return path


def head_list(text: str | None, key: str = "heads") -> str | None:
    """Heads as typed ("12.3,14.2"), read as the step will read them; a malformed item is named."""
    if text:
        try:
            parse_heads(text)
        except ValueError as err:
            raise SettingError(key, text, str(err)) from None
    return text


@dataclass(config=ConfigDict(extra="forbid"))
class HeadChoice:
    """Which heads: explicit `heads` win; else `Components.select` over `effects` with `threshold` and
    `top_k` (neither: the paper's -5%, applied there). Flags of the analysis commands; a run passes its
    key heads as `heads`, with `effects` for the rankings."""

    effects: str | None = Field(
        default=None, description="effects.json from `keyheads patch` (heads ranked most negative first)")
    heads: str | None = Field(
        default=None, description="explicit key heads, e.g. 12.3,14.2 (instead of selecting from effects)")
    threshold: float | None = Field(
        default=None, description="key heads: effect below this (default -0.05, the paper's -5%, unless top_k is "
        "given)")
    top_k: int | None = Field(
        default=None, ge=1, description="key heads: the K most negative (among those below threshold if that is given "
        "too)")

    @field_validator("effects")
    @classmethod
    def _effects(cls, v):
        return effects_file(v)

    @field_validator("heads")
    @classmethod
    def _heads(cls, v):
        return head_list(v)

    @classmethod
    def of(cls, heads: tuple[Head, ...] | list[Head], effects: str | Path | None = None) -> HeadChoice:
        """These heads, with `effects` for the rankings that need it."""
        return cls(effects=str(effects) if effects else None, heads=",".join(map(str, heads)))

    def record(self) -> dict:
        """As the analyses' JSON records it: heads as [layer, head] pairs."""
        return {"heads": [list(h) for h in parse_heads(self.heads or "")], "effects": self.effects,
                "threshold": self.threshold, "top_k": self.top_k}


def choose_heads(model: HookedModel, choice: HeadChoice) -> tuple[list[Head], Effects | None]:
    """(the chosen heads, checked against the model; the Effects, when a file was given)."""
    effects = Effects.load(choice.effects, model) if choice.effects else None
    if choice.heads:
        return list(Components(tuple(parse_heads(choice.heads))).check(model.n_layers, model.n_heads).heads), effects
    if effects is None or choice.effects is None:
        raise AnalysisError("say which heads: --effects effects.json (from `keyheads patch`) or --heads L.H,...")
    return list(Components.select(effects, choice.threshold, choice.top_k, name=Path(choice.effects).name).heads), \
        effects

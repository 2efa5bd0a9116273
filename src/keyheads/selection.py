"""Which heads a step works on (one settings type for every command, stage and variant), and the notes a
run collects. It loads without torch (a model appears only in annotations): the run config and the command
settings use HeadChoice and ComponentChoice."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, field_validator, model_validator

from .components import Components, Threshold, TopK
from .effects import Effects
from .errors import AnalysisError, SettingError
from .heads import Head, parse_layers, read_heads
from .io import existing_file
from .log import logger
from .section import Section

if TYPE_CHECKING:
    from .models.model import HookedModel


class Notes(list):
    """Warnings and remarks: logged when they happen and kept for the run's JSON."""

    def add(self, text: str) -> None:
        if text:
            logger.warning("note: %s", text)
            self.append(text)


def effects_file(path: str | None, key: str = "effects") -> str | None:
    """An effects.json that exists and reads as one: a truncated or foreign file fails before any model loads."""
    if existing_file(key, path, "it is written by `keyheads identify`") is not None:
        Effects.load(path)
    return path


def head_list(text: str | None, key: str = "heads") -> str | None:
    """Heads as typed ("12.3,14.2") or a file of them (keyheads.heads.read_heads: a key-head list or a MIB /
    EAP-IG circuit graph), read as the step will read them; a malformed item or file is named."""
    if text:
        try:
            read_heads(text)
        except ValueError as err:
            raise SettingError(key, text, str(err)) from None
    return text


class HeadChoice(Section):
    """Which heads: explicit `heads` win; else `Components.select` over `effects` with `threshold` and
    `top_k` (neither: the paper's -5%, applied there). Flags of the analysis commands; a run passes its
    key heads as `heads`, with `effects` for the rankings."""

    effects: str | None = Field(
        default=None, description="effects.json from `keyheads identify` (heads ranked most negative first), or a "
        "MIB / EAP-IG circuit graph with node scores (ranked by largest |score|)")
    heads: str | None = Field(
        default=None, description="explicit key heads, e.g. 12.3,14.2, or a JSON/CSV file of them: a key-head list "
        "or a MIB / EAP-IG circuit graph (its a{L}.h{H} nodes with in_graph true) (instead of selecting from effects)")
    threshold: Threshold = None
    top_k: TopK = None

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
        return {"heads": [list(h) for h in (read_heads(self.heads) if self.heads else [])], "effects": self.effects,
                "threshold": self.threshold, "top_k": self.top_k}


def choose_heads(model: HookedModel, choice: HeadChoice) -> tuple[list[Head], Effects | None]:
    """(the chosen heads, checked against the model; the Effects, when a file was given)."""
    effects = Effects.load(choice.effects, model) if choice.effects else None
    if choice.heads:
        return list(Components(tuple(read_heads(choice.heads))).check(model.n_layers, model.n_heads).heads), effects
    if effects is None or choice.effects is None:
        raise AnalysisError("say which heads: --effects effects.json (from `keyheads identify`) or --heads L.H,...")
    return list(Components.select(effects, choice.threshold, choice.top_k, name=Path(choice.effects).name).heads), \
        effects


def layer_list(text: str | None, key: str = "mlp_layers") -> str | None:
    """MLP layers as typed ("14,15"), read as the step will read them."""
    if text:
        try:
            parse_layers(text)
        except ValueError as err:
            raise SettingError(key, text, str(err)) from None
    return text


class ComponentChoice(HeadChoice):
    """What precise SFT trains: heads as HeadChoice chooses them (from effects only with top_k or threshold),
    or `random_heads` seeded random ones (the control); and whole MLPs, the `mlps` most negative by effect
    or explicit `mlp_layers`. The flags of `keyheads finetune`; a run's variants are read into one."""

    threshold: float | None = Field(
        default=None, description="heads: effect below this (with --effects; with neither this nor --top-k, "
        "--effects ranks only the MLPs of --mlps)")
    random_heads: int | None = Field(default=None, ge=1, description="K seeded random heads (the control)")
    mlps: int | None = Field(default=None, ge=0, description="also the M MLPs with the most negative effect")
    mlp_layers: str | None = Field(default=None, description="also these whole MLP layers, e.g. 14,15")

    @field_validator("mlp_layers")
    @classmethod
    def _mlp_layers(cls, v):
        return layer_list(v)

    @model_validator(mode="after")
    def _one_way(self):
        ranked = self.top_k is not None or self.threshold is not None
        if sum([bool(self.heads), self.random_heads is not None, ranked]) > 1:
            raise SettingError("choose heads one way: --effects with --top-k or --threshold, --heads, or "
                               "--random-heads")
        if (ranked or self.mlps) and self.effects is None:
            raise SettingError("--top-k, --threshold and --mlps rank by effect: give --effects effects.json (from "
                               "`keyheads identify`)")
        if self.mlps and self.mlp_layers:
            raise SettingError("give either --mlps M (the top-M by effect) or --mlp-layers L,... (explicit), not both")
        return self

    @property
    def given(self) -> list[str]:
        """The flags that were given, as typed."""
        names = ("effects", "heads", "threshold", "top_k", "random_heads", "mlps", "mlp_layers")
        return ["--" + name.replace("_", "-") for name in names if getattr(self, name) not in (None, "")]

    def components(self, model: HookedModel, seed: int = 0) -> Components:
        """The heads and MLPs, checked against the model (None of either: an empty choice)."""
        effects = Effects.load(self.effects, model) if self.effects else None
        name = Path(self.effects).name if self.effects else ""
        if self.heads:
            chosen = Components.explicit(self.heads)
        elif effects is not None and (self.top_k is not None or self.threshold is not None):
            chosen = Components.select(effects, self.threshold, self.top_k, name=name)
        elif self.random_heads is not None:
            chosen = Components.random_heads(self.random_heads, model.n_layers, model.n_heads, seed)
        else:
            chosen = Components((), (), "no heads")
        if self.mlps and effects is not None:
            chosen = chosen.with_mlps(Components.select(effects, top_k=0, n_mlps=self.mlps, name=name).mlps,
                                      f"top-{self.mlps} MLPs")
        elif self.mlp_layers:
            chosen = chosen.with_mlps(parse_layers(self.mlp_layers), f"MLPs {self.mlp_layers}")
        return chosen.check(model.n_layers, model.n_heads)

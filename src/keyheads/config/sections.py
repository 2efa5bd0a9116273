"""The settings of each step of the study, as sections: a command's settings are its section plus
its files and the machine (keyheads.config.commands); `keyheads run` composes the same sections
(keyheads.config.run). One subset convention everywhere: `limit`, an integer or None for all.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from ..data.templates import load_templates
from ..errors import SettingError
from ..evaluation.config import EvalSettings
from ..finetune.config import FinetuneSettings, check_train
from .base import Count, section_of, take


def check_template_ids(ids: list[str], files=None, key: str = "templates") -> list[str]:
    known = {t.id for t in load_templates(files).templates}
    unknown = [t for t in ids if t not in known]
    if unknown:
        raise SettingError(key, unknown, f"unknown template id(s) {', '.join(unknown)}; the built-in ones "
                                                 "are in keyheads/data/templates/*.yaml")
    return ids


_Training: Any = section_of("_Training", FinetuneSettings, exclude=("method", "seed"))


class FinetuneSection(_Training):
    """The training recipe (FinetuneSettings's fields) and its data."""

    train: str = Field("arith:multidigit,decimal:2000", description="training data: 'arith:KINDS[:N]' from the "
                       "templates, 'trainset' (GSM8K train + held-out AddSub/SingleEq/SVAMP) or a JSONL of "
                       "{prompt, completion}")
    mlps: Count = Field(3, description="MLPs trained by the +mlp variants: the top M by effect")

    @field_validator("train")
    @classmethod
    def _train(cls, v):
        return check_train(v)

    def recipe(self, method: Literal["precise", "full", "lora"], seed: int) -> FinetuneSettings:
        return take(self, FinetuneSettings, method=method, seed=seed)


# split takes "auto" in a run (below); the held-out split is the training set's own, never set apart from it
_Eval: Any = section_of("_Eval", EvalSettings, exclude=(*EvalSettings.CALLER, "split", "heldout"))


class EvalSection(_Eval):
    """The evaluation table (EvalSettings's fields), and which items of the math sets a run scores."""

    split: Literal["auto", "full", "heldout"] = Field(
        "full", description="AddSub/SingleEq/SVAMP items: full (the whole sets, as in the paper), heldout (minus "
        "the part the 'trainset' trains on) or auto (heldout when the run trains on 'trainset', else full)")

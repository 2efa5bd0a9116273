"""The settings of each step of the study, as sections: a command's settings are its section plus
its files and the machine (keyheads.config.commands); `keyheads run` composes the same sections
(keyheads.runconfig). One subset convention everywhere: `limit`, an integer or None for all.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..analysis.attention_run import AttentionRun
from ..analysis.knockout_run import KnockoutRun
from ..analysis.mlp_run import MLPRun
from ..data.generate import PairConfig
from ..data.templates import TASKS, load_templates
from ..errors import SettingError
from ..evaluation.config import EvalConfig
from ..finetune.config import FinetuneConfig
from ..finetune.data import ARITH_KINDS
from ..patching.run import PatchConfig
from .base import Count, section_of

_Pairs: Any = section_of("_Pairs", PairConfig, include=("n", "few_shot", "shared_prefix"))


class DataSection(_Pairs):
    """Which prompt pairs are made (PairConfig's fields, and the templates)."""

    task: str = Field("addition", description=f"{', '.join(TASKS)} or all")
    templates: list[str] = Field(default_factory=list, description="template ids to use, e.g. add-eq-1,add-eq-2 "
                                                                   "(empty: all of the task's)")

    @field_validator("task")
    @classmethod
    def _task(cls, v):
        if v != "all" and v not in TASKS:
            raise SettingError("task", v, f"must be one of {', '.join(TASKS)} or all")
        return v

    @model_validator(mode="after")
    def _template_ids(self):
        check_template_ids(self.templates, getattr(self, "template_files", None) or None)
        return self


def check_template_ids(ids: list[str], files=None) -> list[str]:
    known = {t.id for t in load_templates(files).templates}
    unknown = [t for t in ids if t not in known]
    if unknown:
        raise SettingError("templates", unknown, f"unknown template id(s) {', '.join(unknown)}; the built-in ones "
                                                 "are in keyheads/data/templates/*.yaml")
    return ids


_Patching: Any = section_of("_Patching", PatchConfig, exclude=("batch_size",))


class PatchSection(_Patching):
    """How heads and MLPs are patched (PatchConfig's fields) and which become the key heads."""

    top_k: Count | None = Field(None, description="key heads: the K most negative (below threshold if given)")
    threshold: float | None = Field(None, description="key heads: effect below this (default -0.05, the "
                                                         "paper's -5%, unless top_k is given)")


# what a run shares with `keyheads knockout`, `attention` and `mlp`: all but files, heads and speed
AnalysisSection: Any = section_of("AnalysisSection", AttentionRun, include=("n_samples",))
KnockoutSection: Any = section_of("KnockoutSection", KnockoutRun,
                             include=("n_samples", "k", "seeds", "mean_mode", "transfer_n", "transfer_control"))
MLPSection: Any = section_of("MLPSection", MLPRun, include=("n_samples", "case", "case_answer"))


def check_train(spec: str) -> str:
    """What can be said about a training-data spec before anything loads."""
    if spec.startswith("arith:"):
        kinds, _, n = spec[len("arith:"):].partition(":")
        bad = [k for k in kinds.split(",") if k.strip() not in ARITH_KINDS]
        if bad:
            raise SettingError("train", spec, f"unknown arithmetic kind{'s' * (len(bad) > 1)} "
                                              f"{', '.join(map(repr, bad))}; known: {', '.join(ARITH_KINDS)}")
        if n and (not n.isdigit() or int(n) < 1):
            raise SettingError("train", spec, "N must be an integer >= 1, as in arith:multidigit:2000")
    elif spec != "trainset" and not Path(spec).is_file():
        raise SettingError("train", spec, "is neither a JSONL file, 'trainset' nor 'arith:KINDS[:N]'")
    return spec


_Training: Any = section_of("_Training", FinetuneConfig, exclude=("method", "seed"))


class FinetuneSection(_Training):
    """The training recipe (FinetuneConfig's fields) and its data."""

    train: str = Field("arith:multidigit,decimal:2000", description="training data: 'arith:KINDS[:N]' from the "
                       "templates, 'trainset' (GSM8K train + held-out AddSub/SingleEq/SVAMP) or a JSONL of "
                       "{prompt, completion}")
    mlps: Count = Field(3, description="MLPs trained by the +mlp variants: the top M by effect")

    @field_validator("train")
    @classmethod
    def _train(cls, v):
        return check_train(v)

    def recipe(self, method: Literal["precise", "full", "lora"], seed: int) -> FinetuneConfig:
        return FinetuneConfig(method=method, seed=seed, **self.model_dump(include=set(_Training.model_fields)))


_Eval: Any = section_of("_Eval", EvalConfig, include=("benchmarks", "limit", "few_shot"))


class EvalSection(_Eval):
    """The evaluation table (EvalConfig's fields), and which items of the math sets a run scores."""

    split: Literal["auto", "full", "heldout"] = Field(
        "full", description="AddSub/SingleEq/SVAMP items: full (the whole sets, as in the paper), heldout (minus "
        "the part the 'trainset' trains on) or auto (heldout when the run trains on 'trainset', else full)")

"""The settings of a full run: the YAML of `keyheads run` and the flags of `run`/`demo`.

RunSettings holds the step settings types the commands inherit: `data:`, `identify:`, `knockout:`,
`attention:`, `mlp:`, `finetune:` and `eval:` hold exactly the settings of `keyheads data`, `identify`, ...
of the same names; only what the whole run shares (model, out,
device, dtype, seed, data_dir, the forward batch_size) and the fine-tuning variants sit at the
top. pydantic checks every setting, and the validators add what depends on this machine, before
any model loads; each error names the setting (`finetune.lr`), the value given and what is allowed.
"""
from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, ValidationError, field_validator, model_validator

from ..analysis.settings import AttentionSettings, KnockoutSettings, MLPSettings
from ..data.benchmarks import data_dir_from
from ..data.settings import WORD_PROBLEMS, PairSettings, check_template_ids
from ..data.templates import TASKS, load_templates
from ..data.trainset import SplitSettings
from ..errors import BadFile, SettingError
from ..evaluation.settings import ARITH, EvalSettings
from ..finetune.settings import FinetuneSection
from ..io import read_yaml
from ..machine import check_writable_dir
from ..patching.settings import IdentifySettings
from .base import Batched, DataFolder, DeviceSettings, NonNegative, Section, setting_error

# what also_identify takes: a task of the templates, or the pairs made of GSM8K's test questions
ALSO_IDENTIFY = (*TASKS, WORD_PROBLEMS)

# precise[@K][+mlp[M]] | random[@K][-seedN] | full | lora: K heads (default: the key heads' count), M MLPs; a random
# variant's -seedN draws its heads with seed N instead of the run's (several seeds: the control's band)
VARIANT = re.compile(r"(?P<kind>precise|random)(?:@(?P<k>[1-9]\d*))?(?P<mlp>\+mlp(?P<m>[1-9]\d*)?)?"
                     r"(?:-seed(?P<seed>\d+))?|full|lora")


class RunSettings(Batched, DataFolder, DeviceSettings):
    """Settings of a full run. The forward batch (batch_size) is every stage's; fine-tuning has
    finetune.micro_batch_size."""

    model: str = Field("smollm2-135m", description="bundled name, local folder, .gguf or hub id")
    out: str = Field("runs/demo", description="the run folder")
    seed: NonNegative = Field(0, description="seeds the pairs, the random orders, the random heads and the "
                                             "training order")
    variants: list[str] = Field(default_factory=list, description=(
        "fine-tuning variants trained after the analysis: precise (the key heads), precise@K (the top K heads by "
        "effect), +mlp or +mlpM after either (also the top finetune.mlps or M MLPs), random or random@K (as "
        "many / K seeded random heads: the control; random@K-seedN draws them with seed N, so that several seeds "
        "give the control's band), full, lora"))
    also_identify: list[str] = Field(default_factory=list, description=(
        "more identifications, each a stage identify/NAME after the main one, patched with the identify settings: "
        "a task (the data settings on that task alone: figure 15's operations apart, appendix D's "
        "exponentiation) or gsm8k (appendix E: pairs from data.n GSM8K test questions of data_dir); the rest "
        "of the run reads only the main key heads"), json_schema_extra={"metavar": "SET[,SET...]"})
    circuit: str | None = Field(None, description=(
        "a circuit found by another tool, read instead of patched: a MIB / EAP-IG graph file with node scores "
        "(its in_graph heads are the key heads) or an effects.json (identify.top_k / identify.threshold choose); the "
        "identify stage writes its effects and key heads from it, and every later stage works on them"),
        json_schema_extra={"metavar": "FILE"})
    data: PairSettings = Field(default_factory=PairSettings, description="the prompt pairs (`keyheads data`); "
                               "by default zero-shot, each answer scored by its first token")
    identify: IdentifySettings = Field(default_factory=IdentifySettings, description="patching and the key heads "
                                  "(`keyheads identify`); first_token follows the data unless given: on, unless "
                                  "data.single_token_answer")
    knockout: KnockoutSettings = Field(default_factory=KnockoutSettings, description="knockout curves and transfer "
                                                                                     "(`keyheads knockout`)")
    attention: AttentionSettings = Field(default_factory=AttentionSettings, description="`keyheads attention`")
    mlp: MLPSettings = Field(default_factory=MLPSettings, description="`keyheads mlp`")
    finetune: FinetuneSection = Field(default_factory=FinetuneSection, description="the training recipe of every "
                                      "variant (`keyheads finetune`)")
    eval: EvalSettings = Field(default_factory=EvalSettings, description=(
        "the evaluation table (`keyheads eval`; empty benchmarks: skip the stage). split: by default heldout "
        "when the run trains on 'trainset' (its held-out split is the training set's own), else full"))

    @model_validator(mode="after")
    def _what_follows_from_other_settings(self):
        """The run's one seed in every section that takes one; identify.first_token from the data and eval.split from
        the training data, where they are not given."""
        for name in type(self).model_fields:
            section = getattr(self, name)
            if not isinstance(section, Section) or "seed" not in type(section).model_fields:
                continue
            if "seed" in section.model_fields_set and section.seed != self.seed:
                raise SettingError(f"{name}.seed", section.seed, f"a run has one seed ({self.seed}): set `seed` at "
                                                                 "the top of the config")
            if section.seed != self.seed:
                section.seed = self.seed
        # patching scores the answer as the data does: its first token unless the data keeps one-token answers
        if "first_token" not in self.identify.model_fields_set:
            self.identify.first_token = not self.data.single_token_answer
        # the held-out split is evaluated when the run trains on the training set it was set apart from
        if "split" not in self.eval.model_fields_set:
            self.eval.split = "heldout" if self.variants and self.finetune.train == "trainset" else "full"
        return self

    @field_validator("out")
    @classmethod
    def _out(cls, v):
        check_writable_dir(v, "out")
        return v

    @field_validator("variants")
    @classmethod
    def _variants(cls, v):
        bad = [x for x in v if not VARIANT.fullmatch(x) or (x.startswith("random") and "+mlp" in x)
               or (x.startswith("precise") and "-seed" in x)]
        if bad:
            raise SettingError("variants", v, f"unknown variant(s) {', '.join(bad)}; use precise, precise@K, "
                                              "precise+mlp, precise@K+mlpM, random, random@K, random@K-seedN, "
                                              "full or lora")
        if len(set(v)) != len(v):
            raise SettingError("variants", v, "a variant is listed twice")
        return v

    @field_validator("also_identify")
    @classmethod
    def _also_identify(cls, v):
        bad = [x for x in v if x not in ALSO_IDENTIFY]
        if bad:
            raise SettingError("also_identify", v, f"unknown {', '.join(map(repr, bad))}; valid: "
                                                   f"{', '.join(ALSO_IDENTIFY)}")
        if len(set(v)) != len(v):
            raise SettingError("also_identify", v, "an entry is listed twice")
        return v

    @field_validator("circuit")
    @classmethod
    def _circuit(cls, v):
        if v is not None and not Path(v).is_file():
            raise SettingError("circuit", v, "no such file: give a MIB / EAP-IG graph JSON with node scores, or an "
                                             "effects.json")
        return v

    @model_validator(mode="after")
    def _together(self):
        files = self.data.template_files or None
        check_template_ids(self.data.templates, files, key="data.templates")
        if not self.data.single_token_answer and not self.identify.first_token:
            raise SettingError("identify.first_token", False, "cannot measure the multi-token answers the data keeps "
                                                           "(data.single_token_answer false): leave "
                                                           "identify.first_token "
                                                           "out, or set data.single_token_answer: true")
        folder = data_dir_from(self.data_dir or None)
        need = [b for b in self.eval.benchmarks if b not in ARITH]  # the built-in sets are the only ones without data
        if need and not folder:
            raise SettingError(f"eval.benchmarks {', '.join(need)} read a benchmark folder: set data_dir (or "
                               "$KEYHEADS_DATA), or keep only the built-in arith-* sets")
        chosen = {t.task for t in load_templates(files).templates if t.id in self.data.templates} \
            if self.data.templates else set(TASKS)
        missing = [x for x in self.also_identify if x in TASKS and x not in chosen]
        if missing:
            raise SettingError("also_identify", self.also_identify, f"no {', '.join(missing)} template among "
                               "data.templates: add one, or leave data.templates empty (all templates)")
        if WORD_PROBLEMS in self.also_identify and not folder:
            raise SettingError(f"also_identify {WORD_PROBLEMS} reads the GSM8K test questions from the benchmark "
                               "folder: set data_dir (or $KEYHEADS_DATA)")
        if self.variants and self.finetune.train == "trainset" and not folder:
            raise SettingError("finetune.train 'trainset' is built from the benchmark folder: set data_dir or "
                               "$KEYHEADS_DATA")
        if self.variants and self.finetune.train == "trainset" and self.eval.heldout != SplitSettings():
            raise SettingError("eval.heldout", self.eval.heldout.to_json(), "the run's 'trainset' is built with the "
                               f"default split ({SplitSettings().tag()}): leave eval.heldout out, so that the "
                               "evaluated items are the ones the training set left out")
        if self.variants and (self.max_memory or self.offload_folder):
            raise SettingError("variants are trained on a copy of the model, whose weights must all stay resident: "
                               "drop max_memory and offload_folder (device auto alone splits it over the GPUs)")
        if any(v.startswith("precise") for v in self.variants) and self.identify.top_k is None \
                and self.identify.threshold is None:
            raise SettingError("variants precise trains the key heads: set identify.top_k or identify.threshold")
        return self

    @classmethod
    def make(cls, where: str = "", **values) -> RunSettings:
        """The config from plain (nested) values; a SettingError lists every invalid setting."""
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            raise setting_error(err, where=where) from None

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> RunSettings:
        """The YAML file's settings, with `overrides` (nested dicts, as the flags give them) on top."""
        path = Path(path)
        raw = read_yaml(path, "config file (configs/ has examples)") or {}
        if not isinstance(raw, dict):
            raise BadFile(f"{path}: a config is a mapping of settings, got {type(raw).__name__}")
        return cls.make(where=str(path), **merge_settings(raw, overrides))

    def to_json(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)  # the YAML keys: config.json is a valid config


def merge_settings(base: dict, top: dict) -> dict:
    """Settings: `top` over `base`, section by section (a nested section merged key by key, any other value
    replaced)."""
    out = dict(base)
    for key, value in top.items():
        nested = isinstance(value, dict) and key in out and isinstance(out[key], dict)
        out[key] = merge_settings(out[key], value) if nested else value
    return out

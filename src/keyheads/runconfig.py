"""The settings of a full run, defined once: YAML keys, `keyheads run`/`demo` flags and defaults.

pydantic checks types, ranges and enumerations; the validators below add what depends on
this machine (device, dtype, a writable run folder, the benchmark folder). Everything is
checked before any model loads, and each error names the setting, the value given and what
is allowed.
"""
from __future__ import annotations

import re
from dataclasses import asdict, fields
from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.dataclasses import dataclass

from .data.benchmarks import data_dir_from

Count = Annotated[int, Field(ge=1, strict=True)]
NonNegative = Annotated[int, Field(ge=0, strict=True)]
# precise[@K][+mlp[M]] | random[@K] | full | lora: K heads (default: the key heads' count), M MLPs
VARIANT = re.compile(r"(?P<kind>precise|random)(?:@(?P<k>[1-9]\d*))?(?P<mlp>\+mlp(?P<m>[1-9]\d*)?)?|full|lora")


def _table_benchmarks() -> tuple[str, ...]:
    from .evaluation.tasks import TABLE_BENCHMARKS

    return TABLE_BENCHMARKS


@dataclass(config=ConfigDict(extra="forbid", validate_assignment=True))
class PipelineConfig:
    """Settings of a full run.

    Attributes:
        model: bundled name, local folder, .gguf or hub id.
        out: the run folder.
        device: cpu, cuda, cuda:N, mps or auto (default: a GPU when there is one).
        dtype: float32, bfloat16 or float16 (default: fp32 on CPU, bf16 on GPU).
        task: arithmetic task of the pairs (addition, ..., or all).
        templates: template ids to use (empty: all of the task's).
        n: candidate pairs per task before keeping the correct ones.
        few_shot: solved examples before each prompt.
        shared_prefix: the same examples before every prompt of a template (computed once).
        method: patching method (path, activation, attribution).
        metric: patching metric (relative-logit, logit-diff, prob).
        top_k: key heads = the K most negative (None: the paper's -5% threshold).
        threshold: key heads below this effect (with top_k: both).
        knockout_k: largest k of the knockout curves.
        seeds: random head orders of the knockout curves.
        transfer_n: prompts per transfer set (other formats, SVAMP/GSM8K first tokens).
        analysis_samples: reference prompts for knockout/attention/MLP (None: all).
        finetune: variants to train after the analysis: precise (the key heads), precise@K (the top
            K heads by effect), +mlp or +mlpM after either (also the top finetune_mlps or M MLPs),
            random or random@K (as many / K seeded random heads: the control), full, lora.
        finetune_data: training data: 'arith:KINDS[:N]', 'trainset' or a JSONL of {prompt, completion}.
        finetune_steps: optimizer steps (None: finetune_epochs over the data).
        finetune_epochs: passes over the data when finetune_steps is None.
        finetune_lr: peak learning rate.
        finetune_batch_size: samples per optimizer step.
        finetune_micro_batch_size: samples per forward pass (gradients accumulate).
        finetune_mlps: MLPs trained by precise+mlp (top by effect).
        eval_benchmarks: benchmarks of the evaluation table (empty: skip the stage); arith-*
            sets are built in, the others need data_dir.
        eval_limit: items per benchmark (None: all).
        eval_few_shot: exemplars per evaluation prompt (None: each benchmark's default).
        eval_split: AddSub/SingleEq/SVAMP items evaluated: full (the whole sets, as in the paper),
            heldout (minus the parts the 'trainset' trains on), or auto (heldout when
            finetune_data is 'trainset', so that no trained item is ever evaluated; else full).
        data_dir: benchmark folder (default $KEYHEADS_DATA).
        batch_size: prompts per forward pass.
        seed: seeds the pairs, the random orders, the random heads and the training order.
    """

    model: str = "smollm2-135m"
    out: str = "runs/demo"
    device: Optional[str] = None
    dtype: Optional[str] = None
    task: str = "addition"
    templates: list[str] = Field(default_factory=list)
    n: Count = 300
    few_shot: NonNegative = 3
    shared_prefix: bool = False
    method: Literal["path", "activation", "attribution"] = "path"
    metric: Literal["relative-logit", "logit-diff", "prob"] = "relative-logit"
    top_k: Optional[Count] = 10
    threshold: Optional[float] = None
    knockout_k: Count = 20
    seeds: Count = 5
    transfer_n: Optional[Count] = 100
    analysis_samples: Optional[Count] = 300
    finetune: list[str] = Field(default_factory=list)
    finetune_data: str = "arith:multidigit,decimal:2000"
    finetune_steps: Optional[Count] = None
    finetune_epochs: Annotated[float, Field(gt=0)] = 2.0
    finetune_lr: Annotated[float, Field(gt=0)] = 2e-5
    finetune_batch_size: Count = 128
    finetune_micro_batch_size: Count = 8
    finetune_mlps: Count = 3
    eval_benchmarks: list[str] = Field(default_factory=lambda: list(_table_benchmarks()))
    eval_limit: Optional[Count] = 50
    eval_few_shot: Optional[NonNegative] = None
    eval_split: Literal["auto", "full", "heldout"] = "auto"
    data_dir: Optional[str] = None
    batch_size: Count = 16
    seed: NonNegative = 0

    def resolved_eval_split(self) -> str:
        if self.eval_split != "auto":
            return self.eval_split
        return "heldout" if self.finetune and self.finetune_data == "trainset" else "full"

    @field_validator("device", "dtype", "out", "eval_benchmarks")
    @classmethod
    def _checked(cls, v, info: ValidationInfo):
        from .evaluation.tasks import check_benchmarks
        from .settings import check_device, check_dtype, check_writable_dir

        check = {"device": check_device, "dtype": check_dtype, "out": check_writable_dir,
                 "eval_benchmarks": check_benchmarks}[info.field_name]
        checked = check(v)
        return v if info.field_name in ("out", "eval_benchmarks") else checked

    @field_validator("task")
    @classmethod
    def _task(cls, v):
        from .data.templates import load_templates

        tasks = load_templates().tasks
        if v != "all" and v not in tasks:
            raise ValueError(f"must be one of {', '.join(tasks)} or all")
        return v

    @field_validator("templates")
    @classmethod
    def _templates(cls, v):
        from .data.templates import load_templates

        known = {t.id for t in load_templates().templates}
        unknown = [t for t in v if t not in known]
        if unknown:
            raise ValueError(f"unknown template(s) {', '.join(unknown)}; see `keyheads data --list-templates`")
        return v

    @field_validator("finetune")
    @classmethod
    def _finetune(cls, v):
        bad = [x for x in v if not VARIANT.fullmatch(x) or (x.startswith("random") and "+mlp" in x)]
        if bad:
            raise ValueError(f"unknown variant(s) {', '.join(bad)}; use precise, precise@K, precise+mlp, precise@K+mlpM, "
                             "random, random@K, full or lora")
        if len(set(v)) != len(v):
            raise ValueError("a variant is listed twice")
        return v

    @field_validator("data_dir")
    @classmethod
    def _data_dir(cls, v):
        if v is not None and not Path(v).is_dir():
            raise ValueError("is not a folder (it should hold gsm8k/, svamp/, ..., mmlu/, csqa/)")
        return v

    @model_validator(mode="after")
    def _needs_data(self):
        folder = data_dir_from(self.data_dir or None)
        from .evaluation.tasks import ARITH

        need = [b for b in self.eval_benchmarks if b not in ARITH]  # the built-in sets are the only ones without data
        if need and not folder:
            raise ValueError(f"eval_benchmarks {', '.join(need)} read a benchmark folder: set data_dir (or "
                             "$KEYHEADS_DATA), or keep only the built-in arith-* sets")
        if self.finetune and self.finetune_data == "trainset" and not folder:
            raise ValueError("finetune_data 'trainset' is built from the benchmark folder: set data_dir or $KEYHEADS_DATA")
        if any(v.startswith("precise") for v in self.finetune) and self.top_k is None and self.threshold is None:
            raise ValueError("finetune precise trains the key heads: set top_k or threshold")
        return self

    @classmethod
    def make(cls, **values) -> "PipelineConfig":
        """The config from plain values; a ValueError lists every invalid setting."""
        try:
            return cls(**values)
        except ValidationError as err:
            raise ValueError(describe_errors(err)) from None

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> "PipelineConfig":
        import yaml

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} not found (see configs/ for examples)")
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a config is a mapping of settings, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        try:
            return cls.make(**{**raw, **overrides})
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None

    def to_json(self) -> dict:
        return asdict(self)


def describe_errors(err: ValidationError) -> str:
    """One line per invalid setting: its name, the value given and what is allowed."""
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        given = e.get("input")
        if isinstance(given, dict) or msg.startswith(f"{key}:"):  # the message names the setting already
            lines.append(msg)
        else:
            lines.append(f"{key}: {given!r} given; {msg}")
    return "invalid settings: " + "; ".join(lines)

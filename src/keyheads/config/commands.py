"""One settings model per command, declared by inheriting its step's settings type (whose fields are also the
step's section of a run config) beside its files, the caller's concerns and the machine (keyheads.config.base).
keyheads.commands.flags generates each command's flags from these models."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import CliPositionalArg

from ..analysis.settings import AttentionSettings, KnockoutSettings, MLPSettings
from ..data.settings import PairSettings, check_template_ids
from ..errors import SettingError
from ..evaluation.settings import EvalSettings
from ..evaluation.settings import check_shard as check_shard_range
from ..finetune.settings import FinetuneSettings, check_train
from ..io import existing_file
from ..machine import check_writable_dir, check_writable_file, parse_bytes
from ..mean import KnockoutMean, mean_field
from ..models import DEFAULT_MODEL
from ..patching.settings import IdentifySettings
from ..selection import ComponentChoice, HeadChoice
from .base import Batched, Count, DataFolder, MachineSettings, NonNegative, Quiet, Section, take

MODEL_HELP = "bundled name, .gguf file, local HF folder or hub id"


class Loads(MachineSettings):
    model: str = Field(DEFAULT_MODEL, description=MODEL_HELP)


class Works(Quiet, Loads):
    """A model-loading command that shows progress bars."""


class OutFolder(Section):
    out: str = Field(description="run folder")

    @field_validator("out")
    @classmethod
    def _out(cls, v):
        check_writable_dir(v, "out")
        return v


class PairsIn(Section):
    data: str = Field(description="pairs JSONL (reference, counterfactual, answer[, positions, operands])")

    @field_validator("data")
    @classmethod
    def _data(cls, v):
        return existing_file("data", v, "make one with `keyheads data`")


class DataCommand(PairSettings, Batched, Works):
    out: str = Field(description="output .jsonl file")

    @model_validator(mode="after")
    def _template_ids(self):
        check_template_ids(self.templates, self.template_files or None)
        return self

    def pairs(self) -> PairSettings:
        return take(self, PairSettings)

    @field_validator("out")
    @classmethod
    def _out(cls, v):
        check_writable_file(v, "out")
        return v


class IdentifyCommand(IdentifySettings, Batched, OutFolder, PairsIn, Works):
    restart: bool = Field(False, description="discard a checkpoint in out and start over")


class KnockoutCommand(KnockoutSettings, HeadChoice, Batched, DataFolder, OutFolder, PairsIn, Works):
    transfer_data: str | None = Field(None, description="another pairs file (other templates / tasks), one transfer "
                                                        "set per value of its transfer_by field")

    @field_validator("transfer_data")
    @classmethod
    def _transfer_data(cls, v):
        return existing_file("transfer_data", v)


class AttentionCommand(AttentionSettings, HeadChoice, Batched, OutFolder, PairsIn, Works):
    """`keyheads attention`."""


class MLPCommand(MLPSettings, Batched, OutFolder, PairsIn, Works):
    """`keyheads mlp`."""


class EvalCommand(EvalSettings, Batched, DataFolder, OutFolder, Quiet, MachineSettings):
    model: str | None = Field(None, description=MODEL_HELP + f" (default: {DEFAULT_MODEL}, or with adapter "
                                                                "the adapter's base model)")
    knockout: str | None = Field(None, description="heads to mean-ablate: '12.3,14.2', a JSON/CSV key-head list or "
                                 "a MIB / EAP-IG circuit graph")
    knockout_mlps: str | None = Field(None, description="MLP layers to mean-ablate, e.g. '14,15'")
    knockout_data: str | None = Field(None, description="pairs file whose counterfactual prompts give the means")
    mean: KnockoutMean = mean_field()
    adapter: list[str] = Field(default_factory=list, description="`keyheads finetune` run folders (precise, LoRA or "
                               "full), one more row each; the first one's base model is the first row unless model "
                               "is given")
    base: bool = Field(True, description="the unmodified model's row (--no-base skips it when there is a knockout "
                                         "or adapter row)")
    baseline: str | None = Field(None, description="another model evaluated first, as the reference row for Δ")
    variant: list[dict[str, Any]] = Field(default_factory=list, description='more rows of any registered kind, as '
                                          'JSON: {"kind": ..., "model": ..., "label": ..., "options": {...}}')
    cache_dir: str | None = Field(None, description="per-item result cache, shared by runs (entries are keyed by "
                                  "model fingerprint, prompt and settings; default: $KEYHEADS_CACHE/eval)")
    shard: str | None = Field(None, description="K/N: compute only shard K of N (0-based) of every benchmark, so "
                                 "that N processes sharing cache_dir split the work; then run without it for the "
                                 "table. Under accelerate launch or torchrun the processes shard by themselves")

    @field_validator("knockout_data")
    @classmethod
    def _knockout_data(cls, v):
        return existing_file("knockout_data", v)

    @field_validator("cache_dir")
    @classmethod
    def _cache_dir(cls, v):
        if v is not None:
            check_writable_dir(v, "cache_dir")
        return v

    @field_validator("adapter")
    @classmethod
    def _adapters(cls, v):
        # the adapter module imports torch (it reads a precise run's adapter as tensors): imported only when
        # adapters are given, so that the command settings load without torch
        from ..finetune.adapter import check_run_folder  # noqa: PLC0415

        for folder in v:
            check_run_folder(folder)
        return v

    @field_validator("shard")
    @classmethod
    def _shard(cls, v):
        check_shard(v)
        return v

    def eval_config(self) -> EvalSettings:
        return take(self, EvalSettings)


class FinetuneCommand(FinetuneSettings, ComponentChoice, DataFolder, OutFolder, Works):
    train: str = Field(description="a JSONL of {prompt, completion}; 'trainset' (GSM8K train + held-out "
                       "AddSub/SingleEq/SVAMP); or 'arith:multidigit,decimal[:N]' from the templates")
    limit: Count | None = Field(None, description="use only the first N examples (None: all)")

    @field_validator("train")
    @classmethod
    def _train(cls, v):
        return check_train(v)

    def recipe(self) -> FinetuneSettings:
        return take(self, FinetuneSettings)


class MergeCommand(OutFolder, MachineSettings):
    adapter: str = Field(description="a `keyheads finetune --method precise` run folder")
    out: str = Field(description="new folder to write")
    model: str | None = Field(None, description="base model (default: the one the adapter names)")
    export: Literal["hf", "peft"] = Field("hf", description="hf: merged model folder; peft: the same change as a "
                                                            "PEFT LoRA adapter (exact)")


class ExportCommand(OutFolder):
    """`keyheads export`: a run's key heads and effects as a MIB / EAP-IG circuit graph and TransformerLens hooks."""

    folder: CliPositionalArg[str] = Field(description="a run folder, or an identify folder (effects.json and "
                                          "key_heads.json)")
    out: str = Field(description="folder to write circuit.json (MIB / EAP-IG graph) and hooks.json "
                     "(TransformerLens hook names)")
    mlps: NonNegative = Field(0, description="also put the M MLPs of key_heads.json with the most negative effect "
                              "in the circuit")
    model: str | None = Field(None, description=MODEL_HELP + "; only its config is read, for d_model and whether "
                              "attention and MLP are parallel (default: the run's model, from its model.json)")
    d_model: Count | None = Field(None, description="the model's width for the graph's cfg, instead of reading "
                                  "the model's config")
    parallel_attn_mlp: bool | None = Field(None, description="attention and MLP read the same residual (GPT-J, "
                                           "NeoX), instead of reading the model's config")

    @field_validator("folder")
    @classmethod
    def _folder(cls, v):
        if not Path(v).is_dir():
            raise SettingError("folder", v, "is not a folder: give a run folder or its identify folder")
        return v


class GenerateCommand(Loads):
    prompt: CliPositionalArg[str] = Field(description="the prompt")
    max_new_tokens: Count = Field(20, description="tokens to generate")
    escapes: bool = Field(False, description="interpret backslash escapes such as \\n in the prompt")


class PlanCommand(Batched):
    model: str = Field(DEFAULT_MODEL, description=MODEL_HELP + " (only its config is read)")
    gpus: Count = Field(1, description="GPUs per node")
    nodes: Count = Field(1, description="nodes (training spreads over all GPUs; analyses use one node's)")
    gpu_memory: str = Field("80GiB", description="memory of one GPU, e.g. 80GiB or 80GB")
    host_memory: str | None = Field(None, description="host memory per node for CPU offload, e.g. 512GiB "
                                                       "(null: not checked)")
    seq_len: Count = Field(512, description="training tokens a sample (padded length)")
    micro_batch_size: Count = Field(FinetuneSettings.model_fields["micro_batch_size"].default,
                                    description="training samples per forward pass and process; halved until "
                                                "it fits")
    prompt_len: Count = Field(256, description="analysis tokens a prompt (eval: prompt and generated tokens)")
    heads: Count = Field(32, description="heads trained by precise SFT")
    mlps: NonNegative = Field(3, description="whole MLP layers trained by precise + MLPs")
    lora_rank: Count = Field(8, description="LoRA's rank")
    dtype: Literal["bfloat16", "float16", "float32"] = Field("bfloat16", description="compute dtype")
    as_json: bool = Field(False, alias="json", description="print the plan as JSON")

    @field_validator("gpu_memory", "host_memory")
    @classmethod
    def _memory(cls, v, info):
        if v is not None:
            parse_bytes(v, info.field_name)
        return v


class FaithfulnessCommand(Batched, OutFolder, PairsIn, Works):
    circuit: str = Field(description="the circuit's scores: an effects.json (or a run / identify folder holding one), "
                         "a keyheads export, or a MIB / EAP-IG graph (.json or .pt) with node or edge scores")
    ablation: Literal["counterfactual", "mean"] = Field(
        "counterfactual", description="what a component outside the circuit outputs: its value on the pair's "
        "counterfactual prompt (MIB's patching) or its mean over the counterfactual prompts (see --mean)")
    mean: KnockoutMean = mean_field()
    positions: Literal["all", "end"] = Field("all", description="where a component outside the circuit is ablated: "
                                             "every position (MIB's), or END only (where keyheads' patching methods "
                                             "measure the effects that rank it)")
    metric: Literal["logit", "prob"] = Field("logit", description="the answer token's logit or probability at END, "
                                             "averaged over the pairs")
    absolute: bool = Field(True, description="rank components by |score| (MIB's default); --no-absolute: by score, "
                           "highest first")
    limit: Count | None = Field(None, description="use the first N pairs (None: all)")

    @field_validator("circuit")
    @classmethod
    def _circuit(cls, v):
        if not Path(v).exists():
            raise SettingError("circuit", v, "does not exist: give an effects.json, a run folder or a graph file")
        return v


class ModelsCommand(Section):
    """No settings: lists the bundled models."""


def check_shard(text: str | None) -> tuple[int, int] | None:
    """"K/N" -> (K, N), shard K of N (0-based); None for none."""
    if not text:
        return None
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise SettingError("shard", text, "expected K/N, e.g. 0/4 for the first of four processes") from None
    return check_shard_range((k, n), text)

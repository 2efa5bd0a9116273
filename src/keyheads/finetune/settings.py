"""Fine-tuning settings: the paper's recipe by default, Hugging Face Trainer defaults where it is silent.

TrainingRecipe is how to train; FinetuneSettings adds the method and the seed, and is what `keyheads
finetune`'s flags and `finetune()` take; FinetuneSection adds the training data and the MLP count, and is a
run config's `finetune:` section (a run's variants give the method, its top-level seed the seed). The optimizer batch is
`optimizer_batch_size` everywhere (field, flag and key), so that it is never mistaken for the forward
batch that `--batch-size` sets in every other command. With them, the check of a training-data spec
(`check_train`), run before anything loads. The module loads without torch, as the run config and the
command settings that use it do.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, PositiveFloat, field_validator, model_validator

from ..data.arithmetic import ARITH_KINDS
from ..errors import SettingError
from ..section import Count, Section

FINETUNE_METHODS = ("precise", "full", "lora")  # the values of FinetuneSettings.method
KV_POLICIES = ("group", "none")


class TrainingRecipe(Section):
    """How to train, whatever is trained."""

    kv: Literal["group", "none"] = Field(
        "group", description="group trains a key/value head's rows of W_K and W_V when any query head of its group "
        "is trained; none trains W_Q rows and W_O columns only")
    lr: float = Field(2e-5, gt=0.0, description="peak learning rate (paper: 2e-5)")
    optimizer_batch_size: int = Field(128, ge=1, description="samples per optimizer step over all processes "
                                                             "(paper: 128)")
    micro_batch_size: int = Field(8, ge=1, description="samples per forward pass in one process; gradients "
                                                       "accumulate up to optimizer_batch_size")
    epochs: float = Field(2.0, gt=0.0, description="passes over the data (paper: 2)")
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimizer steps, if fewer "
                                                             "than the epochs give")
    warmup_ratio: float = Field(0.02, ge=0.0, lt=1.0, description="share of the steps with a linear warm-up (paper: "
                                                              "0.02), then linear decay to 0")
    weight_decay: float = Field(0.1, ge=0.0, description="decoupled AdamW decay of weight matrices, not of biases "
                                                       "and norms (paper: 0.1)")
    max_grad_norm: float = Field(1.0, ge=0.0, description="global gradient clipping (Trainer default 1.0; 0 "
                                                        "disables it)")
    rescale: bool = Field(True, description="multiply a layer's head gradients by H/h (H heads in the layer, h "
                                            "trained), as the paper does after DARE; AdamW is invariant to it "
                                            "except through clipping")
    optimizer: Literal["adamw", "adamw8bit", "sgd"] = Field(
        "adamw", description="adamw (the recipe), adamw8bit (bitsandbytes' AdamW with 8-bit moments: a quarter of "
        "the optimizer memory, for full SFT where fp32 AdamW does not fit) or sgd (plain SGD, where the rescale "
        "matters)")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW's betas (Trainer default)")
    adam_eps: float = Field(1e-8, description="AdamW's epsilon (Trainer default)")
    lora_rank: int = Field(8, ge=1, description="LoRA's rank")
    lora_alpha: float | None = Field(None, description="LoRA's scale (None: equal to the rank)")
    save_every: int = Field(50, ge=0, description="optimizer steps between checkpoints (0: only at the end)")
    save_minutes: float = Field(30.0, ge=0.0, description="also checkpoint once this many minutes have passed since "
                                "the last checkpoint, so a killed run loses little when steps are slow (0: by "
                                "steps only)")
    max_length: int = Field(1024, ge=1, description="longest tokenised sample; longer samples are an error, "
                                                    "not silently cut")
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp", description="how several processes share the work: ddp (each holds the whole model) or fsdp (FSDP2: "
        "the model, gradients and optimizer state sharded over the processes; fp32 trained weights, compute in "
        "--dtype). One process may use fsdp too, for --offload")
    offload: bool = Field(False, description="with fsdp on GPUs: keep the shards, gradients and optimizer state in "
                                             "CPU memory, moving each layer to the GPU for its own pass")

    # Settings a resumed run may change without changing what it computes.
    # Offload moves the same numbers between memories: an offloaded run may resume without it, and back.
    RESUMABLE_CHANGES: ClassVar[tuple[str, ...]] = ("save_every", "save_minutes", "offload")


class FinetuneSettings(TrainingRecipe):
    """How to train, what and in which order: the settings `finetune()` takes."""

    method: Literal["precise", "full", "lora"] = Field(
        "precise", description="precise (only the chosen heads' Q/K/V/O slices and whole MLPs), full (every "
        "parameter) or lora (PEFT LoRA on the attention projections)")
    seed: int = Field(0, ge=0, description="data order and any random initialisation (LoRA's A)")

    @classmethod
    def from_json(cls, data: dict) -> FinetuneSettings:
        """From a finetune.json or checkpoint record (its keys that are settings); a record written before the
        optimizer batch had its one name says `batch_size`."""
        data = {("optimizer_batch_size" if k == "batch_size" else k): v for k, v in data.items()}
        return cls.model_validate({k: v for k, v in data.items() if k in cls.model_fields})


def check_arith_kinds(kinds: list[str], key: str, value: object) -> list[str]:
    """The one check that arithmetic kinds are known (ARITH_KINDS); `key` and `value` name the setting."""
    bad = [k for k in kinds if k not in ARITH_KINDS]
    if bad:
        raise SettingError(key, value, f"unknown arithmetic kind{'s' * (len(bad) > 1)} "
                                       f"{', '.join(map(repr, bad))}; known: {', '.join(ARITH_KINDS)}")
    return kinds


def arith_spec(spec: str, key: str = "train") -> tuple[list[str], int]:
    """'arith:KINDS[:N]' -> (kinds, N); unknown kinds or an N that is not an integer >= 1 are a SettingError."""
    kinds_text, _, n_text = spec[len("arith:"):].partition(":")
    kinds = check_arith_kinds([k.strip() for k in kinds_text.split(",")], key, spec)
    if n_text and (not n_text.isdigit() or int(n_text) < 1):
        raise SettingError(key, spec, "N must be an integer >= 1, as in arith:multidigit:2000")
    return kinds, int(n_text) if n_text else 2000


def check_train(spec: str, key: str = "train") -> str:
    """The one check of a training-data spec, before anything loads: 'trainset', 'arith:KINDS[:N]' or a file."""
    if spec.startswith("arith:"):
        arith_spec(spec, key)
    elif spec != "trainset" and not Path(spec).is_file():
        raise SettingError(key, spec, "is neither a JSONL file, 'trainset' nor 'arith:KINDS[:N]'")
    return spec


class FinetuneSection(TrainingRecipe):
    """A run config's `finetune:` section: the recipe of every variant, its training data, and how many MLPs
    the +mlp variants add (the variant gives the method, the run's seed the seed)."""

    train: str = Field("arith:multidigit,decimal:2000", description="training data: 'arith:KINDS[:N]' from the "
                       "templates, 'trainset' (GSM8K train + held-out AddSub/SingleEq/SVAMP) or a JSONL of "
                       "{prompt, completion}")
    mlps: Count = Field(3, description="MLPs trained by the +mlp variants: the top M by effect")
    lr_grid: dict[str, list[PositiveFloat]] = Field(
        {}, description="learning rates to try per rate family ('full', 'lora', 'precise', 'precise@K', ...; a "
        "random@K variant takes precise@K's; a family not listed takes its method's): each rate is trained on "
        "grid_fraction of the schedule and scored on the validation examples, and the rate of lowest validation "
        "loss trains the variant; empty: every variant at lr")
    grid_fraction: float = Field(1 / 3, gt=0.0, le=1.0, description="share of the schedule's optimizer steps a "
                                 "grid point trains")
    validation: Count = Field(100, description="with an lr_grid: training examples set aside (seeded) to score "
                              "the grid on, and trained on by no variant; disjoint from every test item, as the "
                              "training data is")

    lr_chosen: dict[str, PositiveFloat] = Field(
        {}, description="learning rates chosen elsewhere (for example on a smaller model's lr_grid), per rate family "
        "as lr_grid names them: a variant of a listed family (or of a listed method) trains at it, without a grid")

    lr_from: str | None = Field(
        None, description="a study config (for example a smaller model's) whose committed grid cells choose the "
        "rates: a variant of a family that has no lr_grid or lr_chosen entry here trains at the rate that study "
        "chose for the same family, else for its method (precise@10 takes 'precise'), reading its records "
        "(records/CONFIG-NAME/cells); a variant whose rate that study has not chosen yet waits for it",
        json_schema_extra={"metavar": "CONFIG"})

    # the settings that choose a variant's rate and data, not how it trains: a variant's stage takes its family's
    # grid or chosen rate and, with a grid, the validation size; a grid point its fraction (keyheads.pipeline)
    RATE_CHOICE: ClassVar[tuple[str, ...]] = ("lr_grid", "grid_fraction", "validation", "lr_chosen", "lr_from")

    @model_validator(mode="after")
    def _one_choice(self):
        both = sorted(set(self.lr_grid) & set(self.lr_chosen))
        if both:
            raise SettingError("finetune.lr_chosen", ", ".join(both), "a family's rate is either chosen by its "
                               "lr_grid or given in lr_chosen, not both: drop it from one")
        return self

    @field_validator("train")
    @classmethod
    def _train(cls, v):
        return check_train(v)

    @field_validator("lr_from")
    @classmethod
    def _lr_from(cls, v):
        if v is not None and not Path(v).is_file():
            raise SettingError("finetune.lr_from", v, "is not a file: name the study config whose grid chose the "
                               "rates (its cell records are read from records/CONFIG-NAME/cells)")
        return v

    def recipe(self, method: Literal["precise", "full", "lora"], seed: int) -> FinetuneSettings:
        return FinetuneSettings.model_validate({**{name: getattr(self, name) for name in TrainingRecipe.model_fields},
                                                "method": method, "seed": seed})

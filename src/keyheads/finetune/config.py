"""Fine-tuning settings: the paper's recipe by default, Hugging Face Trainer defaults where it is silent."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

METHODS = ("precise", "full", "lora")
KV_POLICIES = ("group", "none")


@dataclass(frozen=True)
class FinetuneConfig:
    """How to train.

    Attributes:
        method: "precise" (only the chosen heads' Q/K/V/O slices and whole MLPs), "full" (every
            parameter) or "lora" (PEFT LoRA on the attention projections).
        kv: "group" trains a key/value head's rows of W_K and W_V when any query head of its group is
            trained; "none" trains W_Q rows and W_O columns only.
        lr: peak learning rate (paper: 2e-5).
        batch_size: samples per optimizer step over all processes (paper: 128).
        micro_batch_size: samples per forward pass in one process; gradients accumulate up to batch_size.
        epochs: passes over the data (paper: 2).
        max_steps: stop after this many optimizer steps, if fewer than the epochs give.
        warmup_ratio: share of the steps with a linear warm-up (paper: 0.02), then linear decay to 0.
        weight_decay: decoupled AdamW decay of weight matrices, not of biases and norms (paper: 0.1).
        max_grad_norm: global gradient clipping (Trainer default 1.0; 0 disables it).
        rescale: multiply a layer's head gradients by H/h (H heads in the layer, h trained), as the
            paper does after DARE. AdamW is invariant to it except through clipping.
        optimizer: "adamw" (the recipe) or "sgd" (plain SGD, where the rescale matters).
        adam_betas, adam_eps: AdamW's (Trainer defaults).
        lora_rank, lora_alpha: LoRA's rank and scale (alpha None: equal to the rank).
        seed: data order and any random initialisation (LoRA's A).
        save_every: optimizer steps between checkpoints (0: only at the end).
        max_length: longest tokenised sample; longer samples are an error, not silently cut.
    """

    method: str = "precise"
    kv: str = "group"
    lr: float = 2e-5
    batch_size: int = 128
    micro_batch_size: int = 8
    epochs: float = 2.0
    max_steps: int | None = None
    warmup_ratio: float = 0.02
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    rescale: bool = True
    optimizer: str = "adamw"
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    lora_rank: int = 8
    lora_alpha: float | None = None
    seed: int = 0
    save_every: int = 50
    max_length: int = 1024

    def __post_init__(self):
        object.__setattr__(self, "adam_betas", tuple(self.adam_betas))
        problems = []
        if self.method not in METHODS:
            problems.append(f"method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.kv not in KV_POLICIES:
            problems.append(f"kv {self.kv!r} is not one of {', '.join(KV_POLICIES)}")
        if self.optimizer not in ("adamw", "sgd"):
            problems.append(f"optimizer {self.optimizer!r} is not one of adamw, sgd")
        for key in ("lr", "epochs"):
            if not getattr(self, key) > 0:
                problems.append(f"{key} must be positive, got {getattr(self, key)}")
        for key in ("batch_size", "micro_batch_size", "lora_rank", "max_length"):
            if not (isinstance(getattr(self, key), int) and getattr(self, key) >= 1):
                problems.append(f"{key} must be an integer >= 1, got {getattr(self, key)!r}")
        if self.max_steps is not None and self.max_steps < 1:
            problems.append(f"max_steps must be >= 1 when given, got {self.max_steps}")
        if not 0 <= self.warmup_ratio < 1:
            problems.append(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        for key in ("weight_decay", "max_grad_norm", "save_every"):
            if getattr(self, key) < 0:
                problems.append(f"{key} must be >= 0, got {getattr(self, key)}")
        if problems:
            raise ValueError("invalid fine-tuning settings: " + "; ".join(problems))

    def to_json(self) -> dict:
        d = asdict(self)
        d["adam_betas"] = list(self.adam_betas)
        return d

    @classmethod
    def from_json(cls, data: dict) -> "FinetuneConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    # Settings a resumed run may change without changing what it computes.
    RESUMABLE_CHANGES = ("save_every",)

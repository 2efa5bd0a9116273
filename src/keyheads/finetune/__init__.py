"""Improve: precise SFT of the key heads' Q/K/V/O slices and whole MLPs, with full-SFT and LoRA baselines.

    from keyheads.components import Components
    from keyheads.finetune import FinetuneSettings, finetune, load_examples
    info = finetune(model, load_examples("arith:multidigit:500"), FinetuneSettings(max_steps=20),
                    "runs/ft", Components.explicit("14.2,23.3"))

Layout, after PEFT: `config` (settings), `layer` (the slice deltas), `model` (making a model
trainable), `data`, `train` and `checkpoint` (the loop), `adapter` (saving, loading, merging,
PEFT export), `run` (one run into one folder) and `integration` (precise SFT inside a Hugging Face
`Trainer` or TRL `SFTTrainer`: `attach`, `save`).

The settings (`config`) load without torch, so that the run config and the command settings validate
without a model library; the names that train or load models load on first use (PEP 562).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names
from .settings import FinetuneSettings

if TYPE_CHECKING:
    from .adapter import apply_adapter, export_peft, load_finetuned, merge, read_adapter
    from .data import Example, load_examples
    from .integration import PreciseSFT, PreciseSFTCallback, attach, save
    from .model import Tuned, make_trainable, precise, slice_plan
    from .run import describe, finetune

__all__ = ["Example", "FinetuneSettings", "PreciseSFT", "PreciseSFTCallback", "Tuned", "apply_adapter", "attach",
           "describe", "export_peft", "finetune", "load_examples", "load_finetuned", "make_trainable", "merge",
           "precise", "read_adapter", "save", "slice_plan"]
_LAZY = {"apply_adapter": ".adapter", "export_peft": ".adapter", "load_finetuned": ".adapter", "merge": ".adapter",
         "read_adapter": ".adapter", "Example": ".data", "load_examples": ".data", "PreciseSFT": ".integration",
         "PreciseSFTCallback": ".integration", "attach": ".integration", "save": ".integration",
         "Tuned": ".model", "make_trainable": ".model", "precise": ".model", "slice_plan": ".model",
         "describe": ".run", "finetune": ".run"}

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals(), __all__)

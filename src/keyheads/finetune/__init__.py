"""Improve: precise SFT of the key heads' Q/K/V/O slices and whole MLPs, with full-SFT and LoRA baselines.

    from keyheads.components import Components
    from keyheads.finetune import FinetuneSettings, finetune, load_examples
    info = finetune(model, load_examples("arith:multidigit:500"), FinetuneSettings(max_steps=20),
                    "runs/ft", Components.explicit("14.2,23.3"))

Layout, after PEFT: `config` (settings), `layer` (the slice deltas), `model` (making a model
trainable), `data`, `train` and `checkpoint` (the loop), `adapter` (saving, loading, merging,
PEFT export) and `run` (one run into one folder).
"""
from .adapter import apply_adapter, export_peft, load_finetuned, merge, read_adapter
from .config import FinetuneSettings
from .data import Example, load_examples
from .model import Tuned, make_trainable, precise, slice_plan
from .run import describe, finetune

__all__ = ["Example", "FinetuneSettings", "Tuned", "apply_adapter", "describe", "export_peft", "finetune",
           "load_examples", "load_finetuned", "make_trainable", "merge", "precise", "read_adapter", "slice_plan"]

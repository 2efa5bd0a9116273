"""Improve: precise SFT of the key heads' Q/K/V/O slices and whole MLPs, with full-SFT and LoRA baselines.

    from keyheads.components import Components
    from keyheads.finetune import FinetuneSettings, finetune, load_examples
    info = finetune(model, load_examples("arith:multidigit:500"), FinetuneSettings(max_steps=20),
                    "runs/ft", Components.explicit("14.2,23.3"))

Layout, after PEFT: `config` (settings), `layer` (the slice deltas), `model` (making a model
trainable), `data`, `train` and `checkpoint` (the loop), `adapter` (saving, loading, merging,
PEFT export), `run` (one run into one folder) and `integration` (precise SFT inside a Hugging Face
`Trainer` or TRL `SFTTrainer`: `attach`, `save`).
"""
from .adapter import apply_adapter, export_peft, load_finetuned, merge, read_adapter
from .config import FinetuneSettings
from .data import Example, load_examples
from .integration import PreciseSFT, PreciseSFTCallback, attach, save
from .model import Tuned, make_trainable, precise, slice_plan
from .run import describe, finetune

__all__ = ["Example", "FinetuneSettings", "PreciseSFT", "PreciseSFTCallback", "Tuned", "apply_adapter", "attach",
           "describe", "export_peft", "finetune", "load_examples", "load_finetuned", "make_trainable", "merge",
           "precise", "read_adapter", "save", "slice_plan"]

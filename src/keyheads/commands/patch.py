"""`keyheads patch`: per-head and per-MLP effects on the answer logit, into a run folder."""
from __future__ import annotations

from pathlib import Path

from ..config.base import take
from ..config.commands import PatchCommand
from ..patching import PatchSettings
from .flags import add_settings, settings
from .models import load_from_args
from .timing import work_time


def cmd_patch(args) -> int:
    cfg: PatchCommand = settings(args)  # before loading a model: a typo or an unwritable --out fails at once
    from .. import distributed
    from ..patching.identify_run import describe, identify
    from ..patching.sweep import clear_checkpoints

    out = Path(cfg.out)
    if cfg.restart:
        clear_checkpoints(out)
    model = load_from_args(cfg)
    with work_time("patch", out):
        effects, keys = identify(model, cfg.data, take(cfg, PatchSettings), out, batch_size=cfg.batch_size,
                                 progress=not cfg.quiet)
        if distributed.is_main():
            print(describe(effects, keys))
            print(f"wrote {out}/effects.json, effects.csv, key_heads.json, heatmap.png, timing.json")
    return 0


def register(sub) -> None:
    p = sub.add_parser("patch", help="path/activation/attribution patching of every head and MLP")
    add_settings(p, PatchCommand)
    p.set_defaults(func=cmd_patch)

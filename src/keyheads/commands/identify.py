"""`keyheads identify`: per-head and per-MLP effects on the answer logit, and the key heads, into a folder.

`--out DIR` is the stage's folder, as for every step command: `keyheads identify --out RUN/identify` writes
RUN/identify/effects.json, where `keyheads run` writes it. `keyheads patch` is the command's old name, kept for one
release: it runs the same command after saying so.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..config.base import take
from ..config.commands import IdentifyCommand
from ..patching import IdentifySettings
from .flags import add_settings, settings
from .models import load_from_args
from .timing import work_time

OLD_NAME = "patch"


def cmd_identify(args) -> int:
    if args.command == OLD_NAME:
        print("keyheads patch is renamed `keyheads identify` (same flags); `patch` goes in the next release",
              file=sys.stderr)
    cfg: IdentifyCommand = settings(args)  # before loading a model: a typo or an unwritable --out fails at once
    from .. import distributed
    from ..patching.identify_run import describe, identify
    from ..patching.sweep import clear_checkpoints

    out = Path(cfg.out)
    if cfg.restart:
        clear_checkpoints(out)
    model = load_from_args(cfg)
    with work_time("identify", out):
        found = identify(model, cfg.data, take(cfg, IdentifySettings), out, batch_size=cfg.batch_size,
                         progress=not cfg.quiet)
        if distributed.is_main():
            print(describe(found))
            print(f"wrote {out}/effects.json, effects.csv, key_heads.json, heatmap.png, timing.json")
    return 0


def register(sub) -> None:
    for name, help in (("identify", "the key heads: path/activation/attribution patching of every head and MLP"),
                       (OLD_NAME, "old name of `identify`, kept for one release")):
        p = sub.add_parser(name, help=help)
        add_settings(p, IdentifyCommand)
        p.set_defaults(func=cmd_identify)

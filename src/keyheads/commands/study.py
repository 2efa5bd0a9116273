"""`keyheads run` (the whole study from a config) and `keyheads demo` (the same on the bundled model).

Both take every PipelineConfig setting as a flag, generated from the one definition in
keyheads/runconfig.py; a flag wins over the YAML file, which wins over the defaults.
"""
from __future__ import annotations

import argparse

from .dataclass_args import add_dataclass_args

COMMON = ("device", "dtype", "seed")  # PipelineConfig settings that are also common flags


def _overrides(args) -> dict:
    from dataclasses import fields

    from ..runconfig import PipelineConfig

    return {f.name: getattr(args, f.name) for f in fields(PipelineConfig) if getattr(args, f.name, None) is not None}


def _run(args, cfg) -> int:
    from ..pipeline import run_pipeline

    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None
    run_pipeline(cfg, stages=stages, start=args.start, force=args.force, progress=not args.quiet)
    return 0


def cmd_run(args) -> int:
    from ..runconfig import PipelineConfig
    from ..settings import apply_common

    apply_common(args)
    overrides = _overrides(args)
    cfg = PipelineConfig.from_yaml(args.config, **overrides) if args.config else PipelineConfig.make(**overrides)
    return _run(args, cfg)


def cmd_demo(args) -> int:
    from ..demo import demo_config
    from ..settings import apply_common

    apply_common(args)
    return _run(args, demo_config(_overrides(args)))


def _add_study_args(p: argparse.ArgumentParser) -> None:
    from ..runconfig import PipelineConfig
    from ..settings import add_common_args

    add_dataclass_args(p, PipelineConfig, skip=COMMON, group_title="settings (also the YAML keys)")
    add_common_args(p, seed_help="seeds the pairs, random orders, random heads and training order")
    p.set_defaults(seed=None)  # unset: the YAML's or the config's default seed stands
    which = p.add_argument_group("which stages")
    which.add_argument("--stages", metavar="S,...", help="run only these stages (data, identify, knockout, attention, "
                       "mlp, finetune or finetune/VARIANT, eval, report); the others are left as they are")
    which.add_argument("--from", dest="start", metavar="STAGE", help="run this stage and every later one")
    which.add_argument("--force", action="store_true", help="re-run the chosen stages even when up to date")


def register(sub) -> None:
    p = sub.add_parser("run", help="the whole study (data, identify, knockout, attention, MLPs, fine-tuning, eval, "
                       "report.html) from a YAML config; re-runs only what a changed setting affects")
    p.add_argument("config", nargs="?", help="YAML file of settings (see configs/); flags override it")
    _add_study_args(p)
    p.set_defaults(func=cmd_run)

    from ..demo import DEMO

    p = sub.add_parser("demo", help="the whole study on the bundled default model, small enough for a laptop CPU",
                       description="The whole study on the bundled SmolLM2-135M into runs/demo/report.html. The demo "
                       "changes these defaults: " + ", ".join(f"{k}={v}" for k, v in DEMO.items())
                       + "; the defaults shown below are `keyheads run`'s. Any flag overrides both.")
    _add_study_args(p)
    p.set_defaults(func=cmd_demo)

"""`keyheads run` (the whole study from a config) and `keyheads demo` (the same on the bundled model).

Both take every RunSettings setting as a flag, generated from the one definition in
keyheads/config/run.py (a section's keys as `--section.key`, e.g. `--finetune.lr`); a flag wins over
the YAML file, which wins over the defaults.
"""
from __future__ import annotations

from pydantic import Field

from ..config.base import Count, MachineSettings
from ..config.run import RunSettings
from ..demo import DEMO, demo_config
from .flags import add_settings, given


class RunFlags(RunSettings):
    """The run config's settings, and two that change how it runs, not what it computes."""

    threads: Count | None = Field(None, description="CPU threads for torch (default: torch's)")
    quiet: bool = Field(False, description="no progress bars")


def _split(args) -> tuple[dict, dict]:
    """(config overrides, how to run) from the flags given."""
    overrides = given(args)
    how = {k: overrides.pop(k) for k in ("threads", "quiet") if k in overrides}
    return overrides, how


def _run(args, cfg: RunSettings, how: dict) -> int:
    from .. import pipeline  # the config was read and checked: now the stages' code

    quiet = how.pop("quiet", False)
    MachineSettings.model_validate(how).apply()
    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None
    # the run's progress and each stage's summary, on standard output (library code only logs)
    pipeline.run_pipeline(cfg, stages=stages, start=args.start, force=args.force, progress=not quiet, say=print)
    return 0


def cmd_run(args) -> int:
    overrides, how = _split(args)
    cfg = RunSettings.from_yaml(args.config, **overrides) if args.config else RunSettings.make(**overrides)
    if args.print_config:
        from ..config.printing import describe  # noqa: PLC0415
        from ..io import read_yaml  # noqa: PLC0415

        print(describe(cfg, (read_yaml(args.config, "config file") or {}) if args.config else {}, overrides), end="")
        return 0
    return _run(args, cfg, how)


def cmd_demo(args) -> int:
    overrides, how = _split(args)
    cfg = demo_config(overrides)
    if args.print_config:
        from ..config.printing import describe  # noqa: PLC0415

        print(describe(cfg, {}, overrides, preset=DEMO, preset_name="demo"), end="")
        return 0
    return _run(args, cfg, how)


def _add_study_args(p) -> None:
    add_settings(p, RunFlags)
    which = p.add_argument_group("which stages")
    which.add_argument("--stages", metavar="S,...", help="run only these stages (data, identify, knockout, attention, "
                       "mlp, finetune or finetune/VARIANT, eval, report); the others are left as they are")
    which.add_argument("--from", dest="start", metavar="STAGE", help="run this stage and every later one")
    which.add_argument("--force", action="store_true", help="re-run the chosen stages even when up to date")
    which.add_argument("--print-config", action="store_true", help="print the resolved settings as YAML, each value "
                       "with where it came from (flag, config file, demo, derived or default), and run nothing")


def register(sub) -> None:
    p = sub.add_parser("run", help="the whole study (data, identify, knockout, attention, MLPs, fine-tuning, eval, "
                       "report.html) from a YAML config; re-runs only what a changed setting affects")
    p.add_argument("config", nargs="?", help="YAML file of settings (see configs/); flags override it")
    _add_study_args(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="the whole study on the bundled default model, small enough for a laptop CPU",
                       description="The whole study on the bundled SmolLM2-135M into runs/demo/report.html. The demo "
                       "changes these defaults: " + ", ".join(f"{k}={v}" for k, v in DEMO.items())
                       + "; the defaults shown below are `keyheads run`'s. Any flag overrides both.")
    _add_study_args(p)
    p.set_defaults(func=cmd_demo)

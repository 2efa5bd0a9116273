"""`keyheads study`: a config's run as cells, each committed as its own record (keyheads.study).

    keyheads study status CONFIG                 # every cell: done, stale (why), pending or waiting, with its time
    keyheads study run CONFIG --cell knockout    # run cells here, each writing its record when it finishes
    keyheads study run CONFIG --next 4 --executor slurm --slurm partition=gpu,gpus_per_node=1,timeout_min=240
    keyheads study merge CONFIG --out DIR        # every record in one run folder (findings, report)
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from ..errors import SettingError
from .flags import add_settings, given
from .run import RunFlags


def _records(args, config: str) -> Path:
    return Path(args.records) if args.records else Path("records") / Path(config).stem / "cells"


def _config(args):
    from ..config.base import MachineSettings  # noqa: PLC0415
    from ..config.run import RunSettings  # noqa: PLC0415

    overrides = given(args)
    quiet = overrides.pop("quiet", False)
    MachineSettings.model_validate({k: overrides.pop(k) for k in ("threads",) if k in overrides}).apply()
    return RunSettings.from_yaml(args.config, **overrides), overrides, quiet


def _minutes(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds / 60:.1f} min"


def cmd_status(args) -> int:
    from ..study.cells import STATES, status  # noqa: PLC0415

    cfg, _, _ = _config(args)
    states = status(cfg, _records(args, args.config))
    width = max(len(s.cell.name) for s in states)
    for s in states:
        measured = "estimated" if s.state in ("pending", "waiting") else "measured"
        print(f"{s.cell.name:<{width}}  {s.state:<7}  {_minutes(s.seconds):>9} ({measured})  {s.why}")
    counts = {k: sum(s.state == k for s in states) for k in STATES}
    print(", ".join(f"{v} {k}" for k, v in counts.items()))
    return 0


def _parse_slurm(text: str | None) -> dict:
    """'partition=gpu,timeout_min=240' -> submitit's slurm_* parameters (numbers as numbers)."""
    out: dict = {}
    for part in filter(None, (text or "").split(",")):
        key, sep, value = part.partition("=")
        if not sep:
            raise SettingError(f"--slurm: {part!r} is not KEY=VALUE (e.g. partition=gpu,timeout_min=240)")
        out[key if key in ("timeout_min", "gpus_per_node", "cpus_per_task", "nodes", "mem_gb") else
            f"slurm_{key}"] = int(value) if value.isdigit() else value
    return out


def cmd_run(args) -> int:
    from ..study.cells import run_cell, status  # noqa: PLC0415

    cfg, overrides, quiet = _config(args)
    records = _records(args, args.config)
    states = status(cfg, records)
    if args.cell:
        names = args.cell
    else:
        names = [s.cell.name for s in states if s.state in ("stale", "pending")][:args.next]  # not waiting
    if not names:
        print("every cell is done")
        return 0
    command = "keyheads " + shlex.join(sys.argv[1:])
    if args.executor == "none":
        for name in names:
            print(f"cell {name}: {run_cell(cfg, records, name, say=print, progress=not quiet, command=command)}")
        return 0
    from ..study.jobs import submit  # noqa: PLC0415

    jobs = submit(args.config, overrides, records, names, args.executor, Path(args.jobs_folder),
                  _parse_slurm(args.slurm), command=command)
    for name, job in zip(names, jobs):
        print(f"cell {name}: job {job.job_id}")
    if args.wait:
        for name, job in zip(names, jobs):
            print(f"cell {name}: {job.result()}")
    return 0


def cmd_merge(args) -> int:
    from ..study.cells import merge  # noqa: PLC0415

    cfg, _, _ = _config(args)
    run = merge(_records(args, args.config), Path(args.out_dir), cfg)
    print(f"merged into {run.root}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("study", help="a config's run as cells, each committed as its own record: status, run, merge")
    cmds = p.add_subparsers(dest="study_command", metavar="ACTION")
    cmds.required = True

    def common(q) -> None:
        q.add_argument("config", help="the study's YAML config (configs/)")
        q.add_argument("--records", help="the folder of its cell records (default: records/CONFIG-NAME/cells)")
        add_settings(q, RunFlags)

    q = cmds.add_parser("status", help="every cell: done, stale (and why) or pending, with its time")
    common(q)
    q.set_defaults(func=cmd_status)
    q = cmds.add_parser("run", help="run cells (here, or as jobs through submitit), each writing its record")
    common(q)
    q.add_argument("--cell", action="append", metavar="NAME", help="a cell to run (repeatable; see status)")
    q.add_argument("--next", type=int, default=1, metavar="N", help="without --cell: the first N cells not done")
    q.add_argument("--executor", choices=["none", "local", "slurm"], default="none",
                   help="none: here, one after the other; local or slurm: one submitit job each, as an array")
    q.add_argument("--jobs-folder", default="runs/jobs", help="submitit's logs and job files")
    q.add_argument("--slurm", metavar="K=V,...", help="SLURM parameters, e.g. partition=gpu,timeout_min=240")
    q.add_argument("--wait", action="store_true", help="wait for the jobs and print each cell's record")
    q.set_defaults(func=cmd_run)
    q = cmds.add_parser("merge", help="every cell record laid into one run folder")
    common(q)
    q.add_argument("--into", dest="out_dir", required=True, help="the run folder to write")
    q.set_defaults(func=cmd_merge)

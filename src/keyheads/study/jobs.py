"""A study's cells as jobs of an existing scheduler, through submitit: its LocalExecutor on one machine (and in the
tests), its SlurmExecutor on a cluster, where the cells go out as one job array. keyheads adds no launcher of its
own: a job is `run_cell` in a fresh process, reading the config file and writing the cell's record.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from ..config.run import RunSettings
from .cells import run_cell

Executor = Literal["local", "slurm"]


def run_cell_job(config: str, overrides: dict, records: str, name: str, command: str = "") -> str:
    """One cell in a job's process: the config read again there (a job carries paths and plain values only)."""
    cfg = RunSettings.from_yaml(config, **overrides)
    return str(run_cell(cfg, Path(records), name, say=print, progress=False, command=command))


def submit(config: str, overrides: dict, records: Path, names: list[str], executor: Executor, folder: Path,
           slurm: dict[str, Any] | None = None, command: str = "") -> list:
    """Submit cells `names` as one job array; -> submitit's jobs (each has .result(), .cancel(), .job_id)."""
    import submitit  # noqa: PLC0415 -- only `study run --executor` needs it

    ex = submitit.AutoExecutor(folder=str(folder), cluster="local" if executor == "local" else "slurm")
    ex.update_parameters(**(slurm or {}))
    n = len(names)
    return ex.map_array(run_cell_job, [config] * n, [overrides] * n, [str(records)] * n, names, [command] * n)

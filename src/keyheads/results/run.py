"""The run's own records: config.json (the settings it ran with), model.json (what it loaded) and
stages/STAGE.json (what each stage ran with; keyheads.stages writes and checks them)."""
from __future__ import annotations

from typing import Any

from ..mean import DEFAULT_MEAN
from .base import AsSaved, Result


class SavedData(AsSaved):
    """config.json's data section: the task it typed; the other settings kept as saved."""

    task: str = "addition"


class SavedKnockout(AsSaved):
    """config.json's knockout section: the mean typed; the other settings kept as saved."""

    mean: str | None = None


class SavedConfig(AsSaved):
    """config.json: the run's effective settings in the YAML's keys (keyheads.config.run.RunSettings, dumped).

    Read back as saved, not validated as settings again: a settings validator that looks at the machine (a CUDA
    GPU, the benchmark folder) would refuse a run made on another one. The keys the report and the studies read are
    typed; every other key is kept as it is (`to_json()` gives the file's content back)."""

    model: str | None = None
    seed: int | None = None
    data: SavedData | None = None
    also_identify: list[str] | None = None
    variants: list[str] | None = None
    knockout: SavedKnockout | None = None

    @property
    def knockout_mean(self) -> str:
        """The run's one knockout mean (keyheads.mean): its knockout section's, else the default."""
        return (self.knockout.mean if self.knockout is not None else None) or DEFAULT_MEAN


class ModelInfo(Result):
    """model.json: the model the run's stages loaded."""

    name: str
    source: str
    fingerprint: str
    n_layers: int
    n_heads: int
    dtype: str
    device: str


class StageSettings(AsSaved):
    """A stage's settings as the config says them: the model fingerprints the report names typed, the others kept as
    saved (each stage has its own)."""

    fingerprint: str | None = None
    model_fingerprint: str | None = None
    base_fingerprint: str | None = None


class StageRecord(Result):
    """One finished stage: its settings and their signature, the sha256 of its inputs and outputs (None: a file
    that was not there), the versions, the seconds it took, the machine and when it finished."""

    stage: str
    signature: str
    settings: StageSettings  # the settings the stage was given
    inputs: dict[str, str | None]
    outputs: dict[str, str | None]
    versions: dict[str, str]
    seconds: float
    machine: dict[str, Any]
    finished: str


class Resigned(Result):
    """A cell re-signed after a refactor (tools/resign_cells.py --witness): its code signature was `was`'s sources
    and is now `now`'s, because the witness study (keyheads.study.witness) gave equal outputs with both and ran
    every changed statement."""

    was: str  # the commit whose sources the cell's signature was
    now: str  # the commit it was re-signed at
    families: list[str]  # the tiny models the witness ran
    compared: int  # output files compared equal


class CellRecord(Result):
    """A study cell's record.json (keyheads.study.cells): which cell, made by what command at which commit, with the
    code signature it computed with and the time it took."""

    cell: str
    model: str
    command: str
    commit: str | None
    stages: list[str]
    code: dict[str, str] | None = None  # None: recorded before cells were signed
    wall_seconds: float | None = None  # None: recorded before cells kept it (its stage records keep each stage's)
    cpu_seconds: float | None = None  # every thread of the process and its children
    adopted_from: str | None = None  # a whole-run record it was made from (tools/adopt_run_record.py)
    recovered: str | None = None  # how a record written after the fact was made
    resigned: list[Resigned] | None = None  # refactors it was carried over by, oldest first

    def seconds_or(self, stages: dict[str, StageRecord]) -> float:
        """Its wall seconds, else the sum of its stage records' seconds."""
        return self.wall_seconds if self.wall_seconds is not None else sum(r.seconds for r in stages.values())

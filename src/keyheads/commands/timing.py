"""A command's own work time, the model's load excluded: printed after its summary, quiet or not, and written
beside its results as timing.json. The result files themselves hold no time, so that the same inputs give the
same bytes."""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..io import write_json

WORK_TIME_JSON = "timing.json"


@dataclass
class WorkTime:
    command: str
    seconds: float = 0.0

    def line(self) -> str:
        return f"{self.command}: {self.seconds:.1f} s of work (model load excluded)"


@contextmanager
def work_time(command: str, out: str | Path) -> Iterator[WorkTime]:
    """Time the block; then the main process writes OUT/timing.json ({command, seconds}) and prints the line."""
    from .. import distributed

    timing = WorkTime(command)
    start = time.perf_counter()
    yield timing
    timing.seconds = round(time.perf_counter() - start, 3)  # printed as written
    if distributed.is_main():
        write_json(Path(out) / WORK_TIME_JSON, {"command": command, "seconds": timing.seconds,
                                                "excludes": "loading the model"})
        print(timing.line())

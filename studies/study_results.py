"""Update one section of studies/RESULTS.md and its index: bench/results.py's `write_section`, on this folder's
file and header."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import results  # noqa: E402

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = """# Study results

What the studies found: accuracies, effects, tables 1 and 2, the findings side by side, bands over random
draws. A section whose title names a script (in studies/) is written by it; the others were written from the
runs they name. The speed and memory of keyheads' steps are in bench/RESULTS.md.
"""


def write_section(title: str, body: str, path: Path = RESULTS) -> None:
    """Replace the section `## title` of studies/RESULTS.md with `body` (or add it at the end)."""
    results.write_section(title, body, path, HEADER)

"""Update one section of a RESULTS file, leaving the other sections as they are, and keep the index of sections at
the file's top in step with them.

bench/RESULTS.md (the default) holds this folder's speed and memory benchmarks; studies/RESULTS.md holds the
studies' findings, written through studies/study_results.py with this same function.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from keyheads.io import atomic_write_text  # noqa: E402

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = """# Benchmark results

Speed and memory of keyheads' steps. A section whose title names a script (in bench/) is written by it; figures are
measured, with the date. What the studies found (accuracies, effects, tables 1 and 2) is in studies/RESULTS.md.
"""
SECTION = re.compile(r"^## (.+)$", re.M)
INDEX = "Sections:"  # the line that opens the index; the index runs from it to the first section


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def with_index(text: str) -> str:
    """`text` with its index rebuilt: one link per `## ` section, in order, between the preamble and the first
    section (a text without sections is returned as it is)."""
    first = SECTION.search(text)
    if first is None:
        return text
    preamble = re.split(rf"^{re.escape(INDEX)}$", text[:first.start()], maxsplit=1, flags=re.M)[0]
    links = "\n".join(f"- [{t}](#{anchor(t)})" for t in SECTION.findall(text))
    return f"{preamble.rstrip()}\n\n{INDEX}\n\n{links}\n\n{text[first.start():]}"


def write_section(title: str, body: str, path: Path = RESULTS, header: str = HEADER) -> None:
    """Replace the section `## title` of `path` with `body` (or add it at the end), and rebuild the index.
    `header` starts a file that does not exist yet."""
    text = path.read_text() if path.exists() else header
    section = f"## {title}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text).rstrip() + "\n"
    else:
        text = text.rstrip() + "\n\n" + section
    atomic_write_text(path, with_index(text))


def read_section(title: str, path: Path = RESULTS) -> str | None:
    """The body of the section `## title` of `path`, stripped as write_section writes it (None without one)."""
    if not path.exists():
        return None
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", path.read_text(), re.S | re.M)
    return found.group(1).strip() if found else None


def matmul_rate(d: int, d_ff: int, rows: int = 4096, repeats: int = 10) -> float:
    """Best-of-`repeats` FLOP/s of a [rows, d] x [d, d_ff] matrix product (the floor's unit of work)."""
    import time

    import torch

    a, w = torch.randn(rows, d), torch.randn(d, d_ff)
    for _ in range(3):
        a @ w
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ w
        best = min(best, time.perf_counter() - t)
    return 2 * rows * d * d_ff / best

"""Update one section of bench/RESULTS.md, leaving the other sections as they are."""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from keyheads.io import atomic_write_text  # noqa: E402

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = "# Benchmark results\n\nEach section is written by the script it names; figures are measured, with the date.\n"


def write_section(title: str, body: str, path: Path = RESULTS) -> None:
    text = path.read_text() if path.exists() else HEADER
    section = f"## {title}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text).rstrip() + "\n"
    else:
        text = text.rstrip() + "\n\n" + section
    atomic_write_text(path, text)


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

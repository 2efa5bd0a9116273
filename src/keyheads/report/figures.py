"""Matplotlib helpers: a headless backend, atomic PNG writing, and the plots the analyses share."""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Iterable, Sequence

import matplotlib

matplotlib.use("Agg")  # no display: figures are files in the run folder
import matplotlib.pyplot as plt  # noqa: E402

from ..io import atomic_write_bytes, atomic_write_text  # noqa: E402


def save_figure(fig, path: str | Path, dpi: int = 130) -> Path:
    """Render to memory first so that a crash never leaves half a PNG in the run folder."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def write_csv(path: str | Path, header: Sequence[str], rows: Iterable[Sequence]) -> Path:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow([f"{v:.6g}" if isinstance(v, float) else v for v in row])
    return atomic_write_text(path, buf.getvalue())


def token_label(text: str) -> str:
    """Readable axis label for a token: spaces and newlines made visible, long tokens cut."""
    text = text.replace("\n", "\\n").replace("\t", "\\t")
    if text.strip() == "":
        return text.replace(" ", "␣") or "''"  # a bare space would be an invisible label
    return text if len(text) <= 12 else text[:11] + "…"


def new_figure(width: float, height: float):
    return plt.subplots(figsize=(width, height))


def subplots(*args, **kwargs):
    return plt.subplots(*args, **kwargs)

"""Matplotlib helpers: a headless backend, atomic PNG writing, and the plots the analyses share.

Matplotlib loads on the first figure, not with this module: every command imports a stage that draws, and
most runs of a command (a resumed stage, `--help`, a bad flag) draw nothing."""
from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from pathlib import Path

from .io import atomic_write_bytes, atomic_write_text


def pyplot():
    """matplotlib.pyplot on the file-only backend (no display: figures are files in the run folder)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def save_figure(fig, path: str | Path, dpi: int = 130) -> Path:
    """Render to memory first so that a crash never leaves half a PNG in the run folder."""
    return atomic_write_bytes(path, png_bytes(fig, dpi))


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
    return pyplot().subplots(figsize=(width, height))


def subplots(*args, **kwargs):
    return pyplot().subplots(*args, **kwargs)


def png_bytes(fig, dpi: int = 130) -> bytes:
    """The figure as PNG bytes (for a page that inlines it), closed afterwards."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
    return buf.getvalue()


def loss_curves(series: dict[str, Sequence[float]], xlabel: str = "optimizer step", ylabel: str = "training loss"):
    """One line per run over steps 1..n; None when there is nothing to plot."""
    series = {k: list(v) for k, v in series.items() if len(v)}
    if not series:
        return None
    fig, ax = new_figure(7.0, 2.8)
    for name, values in series.items():
        ax.plot(range(1, len(values) + 1), values, label=name, linewidth=1.6)
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize=8)
    return fig

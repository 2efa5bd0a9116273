"""Small HTML builders shared by the report sections: escaping, inline images, tables, numbers.

Everything a section shows goes through `esc`, so text from the data (prompts, tokens, labels)
can never break the page, and every figure through `img`, so the page never points at a file.
"""
from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def esc(value: Any) -> str:
    # "://" is written as an entity so that a scan of the file for URLs finds only real references
    # (there are none): a prompt quoting a web address is text, not a resource.
    return html.escape(str(value), quote=True).replace("://", "&#58;//")


def read_json(path: Path) -> Any:
    """The JSON at `path`, or None when the stage did not write it (or wrote something unreadable)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def pct(x: Any, digits: int = 1) -> str:
    """0.347 -> '34.7%'; missing or NaN -> '–'."""
    return f"{100 * x:.{digits}f}%" if is_num(x) else "–"


def signed_pct(x: Any, digits: int = 1) -> str:
    return f"{100 * x:+.{digits}f}%" if is_num(x) else "–"


def points(x: Any) -> str:
    """A difference of two accuracies in percentage points."""
    return f"{100 * x:+.1f}" if is_num(x) else "–"


def num(x: Any, fmt: str = ".4g") -> str:
    return format(x, fmt) if is_num(x) else "–"


def human(n: Any) -> str:
    if not is_num(n):
        return "–"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(int(n))


def img(path: Path, alt: str) -> str:
    """The PNG at `path` inline as a data URI; a note instead when it is missing or not a PNG."""
    try:
        data = path.read_bytes()
    except OSError:
        return note(f"figure {path.name} was not written")
    if not data.startswith(PNG_SIGNATURE):
        return note(f"figure {path.name} is not a PNG file; left out")
    encoded = base64.b64encode(data).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{encoded}" alt="{esc(alt)}">'
            f"<figcaption>{esc(path.parent.name)}/{esc(path.name)}</figcaption></figure>")


def figures(folder: Path, known: Sequence[tuple[str, str]], skip: Sequence[str] = (), others: bool = True) -> str:
    """The stage's known figures in the paper's order, then (with `others`) any other PNG it
    wrote that is not in `skip` (shown elsewhere in the section)."""
    parts = [img(folder / name, alt) for name, alt in known if (folder / name).is_file()]
    if others:
        names = {n for n, _ in known} | set(skip)
        parts += [img(p, p.stem) for p in sorted(folder.glob("*.png")) if p.name not in names]
    return "\n".join(parts)


def cell(value: Any, shown: str | None = None, cls: str = "") -> dict:
    """A table cell: `shown` is the text, `value` sorts it (numbers sort as numbers)."""
    return {"value": value, "shown": shown, "cls": cls}


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    """A sortable table (click a header). Each cell is plain text or a `cell(...)`; numeric cells
    carry their exact value in data-sort, so both the script and the tests read the raw number."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        tds = []
        for c in row:
            if not isinstance(c, dict):
                c = cell(c, None)
            value, shown = c["value"], c["shown"]
            text = shown if shown is not None else ("–" if value is None else str(value))
            attrs = f' data-sort="{value!r}"' if is_num(value) else ""
            attrs += f' class="{c["cls"]}"' if c["cls"] else (' class="n"' if is_num(value) else "")
            tds.append(f"<td{attrs}>{esc(text)}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    return (f'<table class="sortable {cls}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def note(text: str, cls: str = "note") -> str:
    return f'<p class="{cls}">{esc(text)}</p>'


def not_run(stage: str, what: str) -> str:
    """The line a section shows when its stage left nothing behind."""
    return note(f"The {stage} stage did not run in this run folder ({what} is missing).", "note missing")


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>\n{body}\n</section>'


def pre(text: str) -> str:
    return f"<pre>{esc(text)}</pre>"


def bullet_list(items: Iterable[str]) -> str:
    items = list(items)
    return "<ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>" if items else ""


def line_svg(series: dict[str, Sequence[float]], width: int = 640, height: int = 240,
             xlabel: str = "step", ylabel: str = "loss") -> str:
    """A small inline SVG line chart (training losses): no image file and no plotting library."""
    series = {k: [float(v) for v in vs if is_num(v)] for k, vs in series.items()}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return note("no values to plot")
    colours = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f"]
    left, right, top, bottom = 56, 150, 12, 36
    lo = min(min(v) for v in series.values())
    hi = max(max(v) for v in series.values())
    hi = hi if hi > lo else lo + 1.0
    n = max(len(v) for v in series.values())
    pw, ph = width - left - right, height - top - bottom

    def xy(i: int, v: float) -> str:
        x = left + (pw * i / (n - 1) if n > 1 else pw / 2)
        return f"{x:.1f},{top + ph * (hi - v) / (hi - lo):.1f}"

    parts = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>',
             f'<text x="{left - 6}" y="{top + 10}" text-anchor="end">{hi:.3g}</text>',
             f'<text x="{left - 6}" y="{top + ph}" text-anchor="end">{lo:.3g}</text>',
             f'<text x="{left}" y="{height - 8}">1</text>',
             f'<text x="{left + pw}" y="{height - 8}" text-anchor="end">{n}</text>',
             f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">{esc(xlabel)}</text>',
             f'<text x="14" y="{top + ph / 2}" transform="rotate(-90 14 {top + ph / 2})" '
             f'text-anchor="middle">{esc(ylabel)}</text>']
    for j, (name, values) in enumerate(series.items()):
        colour = colours[j % len(colours)]
        pts = " ".join(xy(i, v) for i, v in enumerate(values))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.8" points="{pts}"/>')
        parts.append(f'<text x="{left + pw + 8}" y="{top + 14 + 16 * j}" fill="{colour}">{esc(name)}</text>')
    return "".join(parts) + "</svg>"

"""The report's HTML building blocks, rendered by the Jinja2 macros in templates/macros.html.j2.

Autoescape is on, so text from the data (prompts, tokens, labels) can never break the page: only
what the templates produce is markup (a `Markup` string), everything else is escaped where it lands.
Every figure goes through `img`, so the page never points at a file.
"""
from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def esc(value: Any) -> Markup:
    """`value` as HTML text. "://" is written as an entity so that a scan of the file for URLs finds
    only real references (there are none): a prompt quoting a web address is text, not a resource."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(str(value), quote=True).replace("://", "&#58;//"))


# finalize=esc: every {{ value }} in the templates goes through esc (Markup passes unchanged)
ENV = Environment(loader=PackageLoader("keyheads.report", "templates"), autoescape=True, finalize=esc,
                  undefined=StrictUndefined, keep_trailing_newline=True)
MACROS: Any = ENV.get_template("macros.html.j2").module  # its macros are attributes made at run time


def join(parts: Iterable[Any], sep: str = "\n") -> Markup:
    """Rendered pieces one after another (empty ones left out); plain text among them is escaped."""
    return Markup(sep).join(esc(p) for p in parts if p)


def is_num(x: Any) -> TypeGuard[float]:
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


def png(data: bytes, alt: str, caption: str) -> Markup:
    """PNG bytes inline as a data URI (the page needs no other file)."""
    return MACROS.figure(base64.b64encode(data).decode("ascii"), alt, caption)


def img(path: Path, alt: str) -> Markup:
    """The PNG at `path` inline; a note instead when it is missing or not a PNG."""
    try:
        data = path.read_bytes()
    except OSError:
        return note(f"figure {path.name} was not written")
    if not data.startswith(PNG_SIGNATURE):
        return note(f"figure {path.name} is not a PNG file; left out")
    return png(data, alt, f"{path.parent.name}/{path.name}")


def figures(folder: Path, known: Sequence[tuple[str, str]], skip: Sequence[str] = (), others: bool = True) -> Markup:
    """The stage's known figures in the paper's order, then (with `others`) any other PNG it
    wrote that is not in `skip` (shown elsewhere in the section)."""
    parts = [img(folder / name, alt) for name, alt in known if (folder / name).is_file()]
    if others:
        names = {n for n, _ in known} | set(skip)
        parts += [img(p, p.stem) for p in sorted(folder.glob("*.png")) if p.name not in names]
    return join(parts)


def side_by_side(parts: Iterable[Any]) -> Markup:
    """Figures in one row, wrapping onto more where the page is narrow."""
    return MACROS.side_by_side(join(parts))


def cell(value: Any, shown: str | None = None, cls: str = "") -> dict:
    """A table cell: `shown` is the text, `value` sorts it (numbers sort as numbers)."""
    return {"value": value, "shown": shown, "cls": cls}


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> Markup:
    """A sortable table (click a header) in a box that scrolls sideways when it is wider than the page.
    Each cell is plain text or a `cell(...)`; numeric cells carry their exact value in data-sort, so
    both the script and the tests read the raw number."""
    shown = []
    for row in rows:
        tds = []
        for c in row:
            if not isinstance(c, dict):
                c = cell(c, None)
            value, text = c["value"], c["shown"]
            text = text if text is not None else ("–" if value is None else str(value))
            number = is_num(value)
            tds.append({"text": text, "sort": repr(value) if number else None,
                        "cls": c["cls"] or ("n" if number else "")})
        shown.append(tds)
    return MACROS.table(list(header), shown, cls)


def note(text: str, cls: str = "note") -> Markup:
    return MACROS.note(text, cls)


def para(text: str, cls: str = "", id: str = "") -> Markup:
    return MACROS.para(text, cls, id)


def heading(text: str, level: int = 3) -> Markup:
    return MACROS.heading(text, level)


def not_run(stage: str, what: str) -> Markup:
    """The line a section shows when its stage left nothing behind."""
    return note(f"The {stage} stage did not run in this run folder ({what} is missing).", "note missing")


def section(anchor: str, title: str, body: Any) -> Markup:
    return MACROS.section(anchor, title, esc(body))


def pre(text: str) -> Markup:
    return MACROS.pre(text)


def bullet_list(items: Iterable[str]) -> Markup:
    return MACROS.bullets(list(items))

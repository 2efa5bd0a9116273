"""A cell's code signature: a hash of each module whose code computes its stages' numbers, so that `keyheads study
status` can say a committed cell was made by other code than the checkout's.

Each module is hashed as Python reads it, not as it is spelt: its syntax tree with docstrings left out, so a comment,
a docstring or a line wrapped differently keeps a cell done, and a changed statement makes it stale. What a stage
reads and how it is set up (its settings, its inputs' hashes) is compared apart (keyheads.study.cells), so the
wiring in keyheads.pipeline is not hashed here.
"""
from __future__ import annotations

import ast
import hashlib
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # src/keyheads

# the code each kind of cell computes with (packages and modules of keyheads); every kind runs a model
_MODELS = ("models", "heads.py", "components.py", "io.py")
CODE: dict[str, tuple[str, ...]] = {
    "identify": ("data", "patching", "effects.py", "circuits.py"),
    "knockout": ("analysis", "knockout.py", "mean.py"),
    "attention": ("analysis",),
    "mlp": ("analysis",),
    "eval": ("evaluation", "knockout.py", "mean.py"),
    "finetune": ("finetune", "evaluation", "data"),
}


def kind(stage: str) -> str:
    """The kind of a pipeline stage: identify/NAME and data count as identify, eval/ROW as eval, ..."""
    head = stage.split("/", 1)[0]
    return "identify" if head == "data" else head


def _module_hash(path: Path) -> str:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return hashlib.sha256(ast.dump(tree, annotate_fields=False).encode()).hexdigest()[:16]


@cache
def _files(entry: str) -> tuple[Path, ...]:
    path = PACKAGE / entry
    return tuple(sorted(path.rglob("*.py"))) if path.is_dir() else (path,)


def signature(stages: tuple[str, ...] | list[str]) -> dict[str, str]:
    """{module path relative to the package: hash} of every module the stages' kinds compute with. A settings
    module (settings.py) is left out: it declares the settings, whose values the cell's stage records hold and
    status compares."""
    entries = sorted({e for s in stages if kind(s) in CODE for e in (*CODE[kind(s)], *_MODELS)})
    return {p.relative_to(PACKAGE).as_posix(): _module_hash(p) for e in entries for p in _files(e) if _counted(p.name)}


def _counted(name: str) -> bool:
    return not name.endswith("settings.py")


def changed(recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    """The modules whose code differs between a record's signature and the checkout's (added and removed too)."""
    return sorted(m for m in recorded.keys() | now.keys() if _counted(m) and recorded.get(m) != now.get(m))

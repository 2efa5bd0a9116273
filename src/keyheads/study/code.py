"""A cell's code signature: a hash of each module whose code computes its stages' numbers, so that `keyheads study
status` can say a committed cell was made by other code than the checkout's.

Each module is hashed as Python reads it, not as it is spelt: its syntax tree with docstrings left out and the text of
every raised error blanked, so a comment, a docstring, an error message's wording or a line wrapped differently keeps
a cell done, and a changed statement makes it stale. (Cells signed before messages were blanked were re-signed from
their recorded commit's sources by tools/resign_cells.py.) What a stage
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


def source_hash(text: str, blank_errors: bool = True) -> str:
    """The hash of one module's source: its syntax tree less docstrings and the words of the errors it raises
    (`blank_errors` False: the words counted, as cells signed before 2026-11-29 were hashed)."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
        if blank_errors and isinstance(node, ast.Raise):  # what an error says computes no number
            for part in ast.walk(node):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    part.value = ""
    return hashlib.sha256(ast.dump(tree, annotate_fields=False).encode()).hexdigest()[:16]


def _module_hash(path: Path) -> str:
    return source_hash(path.read_text(encoding="utf-8"))


@cache
def _files(entry: str) -> tuple[Path, ...]:
    path = PACKAGE / entry
    return tuple(sorted(path.rglob("*.py"))) if path.is_dir() else (path,)


def entries(stages: tuple[str, ...] | list[str]) -> list[str]:
    """The packages and modules (relative to src/keyheads) the stages' kinds compute with."""
    return sorted({e for s in stages if kind(s) in CODE for e in (*CODE[kind(s)], *_MODELS)})


def signature(stages: tuple[str, ...] | list[str]) -> dict[str, str]:
    """{module path relative to the package: hash} of every module the stages' kinds compute with. A settings
    module (settings.py) is left out: it declares the settings, whose values the cell's stage records hold and
    status compares."""
    return {p.relative_to(PACKAGE).as_posix(): _module_hash(p) for e in entries(stages) for p in _files(e)
            if counted(p.name)}


def counted(name: str) -> bool:
    return not name.endswith("settings.py")


def changed(recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    """The modules whose code differs between a record's signature and the checkout's (added and removed too)."""
    differ = set(recorded.items()) ^ set(now.items())  # a module's (name, hash) on one side only
    return sorted({m for m, _ in differ if counted(m)})

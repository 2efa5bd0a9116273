"""What a result records about how it was made, and how two such records differ.

`versions()` goes into every stage record and finetune.json, `machine_record()` into stage records;
`changed_settings` says which settings differ between a stored record and a new run (stages re-run,
checkpoints refuse to resume).
"""
from __future__ import annotations

import functools
import os
import platform
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import transformers

from .version import __version__

PACKAGE = Path(__file__).resolve().parent  # the code whose commit a record names


def versions() -> dict:
    """The versions that decide the numbers: this package (and, run from a git checkout, its commit), torch,
    transformers, Python."""
    out = {"keyheads": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version()}
    commit = code_commit()
    if commit is not None:
        out["commit"] = commit
    return out


@functools.cache
def code_commit(package: Path = PACKAGE) -> str | None:
    """The commit of the git checkout this package runs from, with " + uncommitted changes" when `git status`
    shows a change to the package's own files; None for an installed wheel (or without git). A study that runs
    for days over changing code can then say which commit made each stage (studies/record.py reads it)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=package, capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()

    try:
        git("ls-files", "--error-unmatch", "__init__.py")  # the checkout tracks this code (not a venv inside one)
        sha = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + (" + uncommitted changes" if changed else "")


def machine_record() -> dict:
    """Where the numbers were computed (for the reader; not part of any signature)."""
    return {"system": platform.system(), "arch": platform.machine(), "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def flatten(settings: dict, prefix: str = "") -> dict:
    """Nested settings as one level of dotted keys: {"config": {"lr": 1}} -> {"config.lr": 1}."""
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def changed_settings(old: dict, new: dict, skip: Iterable[str] = (), missing: Any = None) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for every setting that differs, sorted by key; a setting
    one side lacks reads as `missing` there, and keys in `skip` are not compared. None and an empty list or
    mapping are the same setting (a list setting's default once written as None, now as [])."""
    a, b = flatten(old), flatten(new)
    keys = sorted((a.keys() | b.keys()) - set(skip))
    a, b = (dict.fromkeys(keys, missing) | side for side in (a, b))
    return [(k, a[k], b[k]) for k in keys if a[k] != b[k] and not (_unset(a[k]) and _unset(b[k]))]


def _unset(value: Any) -> bool:
    return value is None or (isinstance(value, list | dict) and not value)

"""What a result records about how it was made, and how two such records differ.

`versions()` goes into every stage record and finetune.json, `machine_record()` into stage records;
`changed_settings` says which settings differ between a stored record and a new run (stages re-run,
checkpoints refuse to resume).
"""
from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from typing import Any

import torch
import transformers

from .version import __version__


def versions() -> dict:
    """The versions that decide the numbers: this package, torch, transformers, Python."""
    return {"keyheads": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


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
    one side lacks reads as `missing` there, and keys in `skip` are not compared."""
    a, b = flatten(old), flatten(new)
    skip = set(skip)
    keys = sorted(k for k in set(a) | set(b) if k not in skip)
    pairs = ((k, a.get(k, missing), b.get(k, missing)) for k in keys)
    return [(k, x, y) for k, x, y in pairs if x != y]

"""keyheads: find, explain and fine-tune the parts of a language model that do arithmetic.

The model names (`HookedModel`, `load_model`) load on first use (PEP 562), so that `import keyheads.report`,
`keyheads.runfolder` or `keyheads.config` does not import torch and transformers: a run folder renders, and a
config validates, on a machine without them loaded.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__

if TYPE_CHECKING:
    from .models import HookedModel, load_model

__all__ = ["HookedModel", "load_model", "__version__"]
_LAZY = {"HookedModel": ".models", "load_model": ".models"}  # public name -> the module that defines it


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

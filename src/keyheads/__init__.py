"""keyheads: find, explain and fine-tune the parts of a language model that do arithmetic.

The model names (`HookedModel`, `load_model`) load on first use (PEP 562), so that `import keyheads.report`,
`keyheads.runfolder` or `keyheads.config` does not import torch and transformers: a run folder renders, and a
config validates, on a machine without them loaded.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_names
from .version import __version__

if TYPE_CHECKING:
    from .models import HookedModel, load_model

__all__ = ["HookedModel", "load_model", "__version__"]
_LAZY = {"HookedModel": ".models", "load_model": ".models"}  # public name -> the module that defines it

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals(), __all__)

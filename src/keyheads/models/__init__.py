"""Model layer: load any supported causal LM and reach its heads, MLPs and residual stream.

The bundled models' names (`bundled`: BUNDLED, DEFAULT_MODEL) load without torch, so that the command settings
name the default model without a model library; the names that load or run models load on first use (PEP 562).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names
from .bundled import BUNDLED, DEFAULT_MODEL

if TYPE_CHECKING:
    from .families import FAMILIES, Family, UnsupportedArchitecture, family_for
    from .hooks import GLOBAL_POINTS, LAYER_POINTS
    from .loading import (
        MissingPackage,
        ModelNotFound,
        Placement,
        cache_root,
        ensure_converted,
        load_model,
        load_placed,
        place,
    )
    from .model import Encoded, HookedModel

__all__ = [
    "BUNDLED", "DEFAULT_MODEL", "FAMILIES", "Family", "UnsupportedArchitecture", "family_for",
    "GLOBAL_POINTS", "LAYER_POINTS", "MissingPackage", "ModelNotFound", "cache_root",
    "ensure_converted", "load_model", "load_placed", "place", "Placement", "Encoded", "HookedModel",
]
_LAZY = {**dict.fromkeys(("FAMILIES", "Family", "UnsupportedArchitecture", "family_for"), ".families"),
         **dict.fromkeys(("GLOBAL_POINTS", "LAYER_POINTS"), ".hooks"),
         **dict.fromkeys(("MissingPackage", "ModelNotFound", "Placement", "cache_root", "ensure_converted",
                          "load_model", "load_placed", "place"), ".loading"),
         **dict.fromkeys(("Encoded", "HookedModel"), ".model")}

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals(), __all__)

"""Model layer: load any supported causal LM and reach its heads, MLPs and residual stream."""
from .bundled import BUNDLED, DEFAULT_MODEL
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

"""Identify: path patching (exact and fast), activation patching and attribution patching.

The settings (`settings`: IdentifySettings and the names of the methods and metrics) load without torch, so that
the run config and the command settings validate without a model library; the names that run models load on
first use (PEP 562).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import BadSample
from ..lazy import lazy_names
from .settings import METRICS, IdentifySettings

if TYPE_CHECKING:
    from .from_circuit import identify_from
    from .heatmap import draw_heatmap
    from .identify_run import describe, identify
    from .samples import load_patch_samples
    from .sweep import PATCH_METHODS, run_sweep

__all__ = ["PATCH_METHODS", "METRICS", "BadSample", "IdentifySettings", "describe", "draw_heatmap", "identify",
           "identify_from", "load_patch_samples", "run_sweep"]
_LAZY = {"draw_heatmap": ".heatmap", "describe": ".identify_run", "identify": ".identify_run",
         "identify_from": ".from_circuit",
         "PATCH_METHODS": ".sweep", "run_sweep": ".sweep", "load_patch_samples": ".samples"}

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals(), __all__)

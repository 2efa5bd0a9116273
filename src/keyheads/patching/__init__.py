"""Identify: path patching (exact and fast), activation patching and attribution patching."""
from ..errors import BadSample
from .heatmap import draw_heatmap
from .identify import describe, identify
from .metrics import METRICS
from .run import PATCH_METHODS, PatchSettings, sweep
from .samples import load_patch_samples

__all__ = ["PATCH_METHODS", "METRICS", "BadSample", "PatchSettings", "describe", "draw_heatmap", "identify",
           "load_patch_samples", "sweep"]

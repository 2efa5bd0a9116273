"""Identify: path patching (exact and fast), activation patching and attribution patching."""
from .heatmap import draw_heatmap
from .identify import describe, identify
from .metrics import METRICS
from .results import PAPER_THRESHOLD, Effects, key_heads, select_heads
from .run import METHODS, PatchConfig, sweep
from .samples import BadSample, load_patch_samples

__all__ = ["METHODS", "METRICS", "PAPER_THRESHOLD", "BadSample", "Effects", "PatchConfig", "describe", "draw_heatmap", "identify", "key_heads",
           "load_patch_samples", "select_heads", "sweep"]

"""The settings of the identify step (patching and the key-head choice): what the effects and the key heads depend
on (IdentifySettings), and the names of the methods and metrics. The patching code is in sweep.py, metrics.py and
the method modules; the settings load without torch, so that keyheads.config.run and keyheads.config.commands
validate a config without a model library."""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from ..components import Threshold, TopK
from ..errors import SettingError
from ..section import Section

# the patching methods, in the order of sweep.PATCH_METHODS (which maps each to its code)
METHODS = ("path", "activation", "attribution", "attribution-ig", "path-naive")
METRICS = ("relative-logit", "logit-diff", "prob")


def check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise SettingError("metric", metric, f"unknown metric: valid metrics are {', '.join(METRICS)}")
    return metric


def check_method(method: str) -> str:
    if method not in METHODS:
        raise SettingError("method", method, f"unknown method: valid methods are {', '.join(METHODS)}")
    return method


class IdentifySettings(Section):
    """What the effects and the key heads depend on: the flags of `keyheads identify` (with its files and
    machine) and a run's `identify:` section, passed whole to `identify`."""

    method: str = Field(
        default="path", description="path (exact, fast), activation (total effect), attribution (gradient "
        "estimate), attribution-ig (its integrated-gradients variant, 5 steps) or path-naive (one forward per sender; "
        "for checking)")
    metric: str = Field(default="relative-logit", description="relative-logit (the paper's), logit-diff or prob")
    limit: int | None = Field(default=None, ge=1, description="use the first N pairs (None: all)")
    min_abs_logit: float = Field(
        default=1e-2, description="relative-logit excludes samples whose original answer logit is "
        "closer to zero (they are counted as n_excluded)")
    first_token: bool = Field(default=False, description="accept multi-token answers and measure their first token")
    top_k: TopK = None
    threshold: Threshold = None

    # the settings that act after the per-sample arrays (which samples count, which heads are key): the sweep's
    # checkpoint holds the arrays, so it is keyed by every other setting
    AFTER_THE_ARRAYS: ClassVar[frozenset[str]] = frozenset({"min_abs_logit", "top_k", "threshold"})

    def checkpoint_key(self) -> dict:
        """The settings the per-sample arrays depend on: the settings whole, less those that act after them."""
        return {k: v for k, v in self.to_json().items() if k not in self.AFTER_THE_ARRAYS}

    @field_validator("method")
    @classmethod
    def _method(cls, v):
        return check_method(v)

    @field_validator("metric")
    @classmethod
    def _metric(cls, v):
        return check_metric(v)

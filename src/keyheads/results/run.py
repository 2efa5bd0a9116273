"""The run's own records: model.json (what the run loaded) and stages/STAGE.json (what each stage ran with;
keyheads.stages writes and checks them)."""
from __future__ import annotations

from typing import Any

from .base import Result


class ModelInfo(Result):
    """model.json: the model the run's stages loaded."""

    name: str
    source: str
    fingerprint: str
    n_layers: int
    n_heads: int
    dtype: str
    device: str


class StageRecord(Result):
    """One finished stage: its settings and their signature, the sha256 of its inputs and outputs (None: a file
    that was not there), the versions, the seconds it took, the machine and when it finished."""

    stage: str
    signature: str
    settings: dict[str, Any]  # the settings the stage was given, as the config says them
    inputs: dict[str, str | None]
    outputs: dict[str, str | None]
    versions: dict[str, str]
    seconds: float
    machine: dict[str, Any]
    finished: str

"""finetune.json: what one fine-tuning run trained (method, components, data, settings) and how it went.

The precise adapter's metadata repeats part of it (keyheads.finetune.adapter); `config` is the run's
FinetuneSettings as saved, which keyheads.finetune reads back as settings.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import PlainSerializer, PlainValidator

from ..components import Components
from .base import AsSaved, Result


def _components(value: Any) -> Components:
    if isinstance(value, Components):
        return value
    if not isinstance(value, dict) or ("heads" in value and not isinstance(value["heads"], list)):
        raise ValueError(f"expected {{\"heads\": [...], \"mlps\": [...], \"source\": ...}}, got {value!r}")
    return Components.from_json(value)


# Components as saved: {"heads": [{"layer", "head"}], "mlps": [...], "source": "..."}
ComponentsField = Annotated[Components, PlainValidator(_components), PlainSerializer(Components.to_json)]


class SavedFinetuneSettings(AsSaved):
    """finetune.json's `config`: the run's FinetuneSettings as saved (keyheads.finetune.settings). The keys the
    report and the studies read are typed; the others are kept as written, so that a record of an older release
    reads and writes back as it was."""

    seed: int | None = None
    lr: float | None = None
    epochs: float | None = None
    micro_batch_size: int | None = None


class TrainingData(Result):
    """The examples trained on: their name, their sha256 and how many."""

    name: str
    sha256: str
    n: int


class Training(Result):
    """The optimizer steps of the whole run (`steps`, `losses`) and of the process that finished it (*_this_run:
    a resumed run counts only its own)."""

    steps: int
    steps_this_run: int
    samples_this_run: int
    seconds_this_run: float
    samples_per_second: float
    final_loss: float
    losses: list[float]
    wall_seconds: float
    processes: int
    parallel: str
    device: str


class FinetuneResult(Result):
    base_model: str
    base_fingerprint: str
    method: str  # precise | full | lora
    components: ComponentsField | None  # what precise SFT trained; None for full SFT and LoRA
    data: TrainingData
    config: SavedFinetuneSettings
    kv: str | None  # precise SFT's K/V policy
    tuned_params: int
    total_params: int
    train: Training
    versions: dict[str, str]

    @property
    def random_heads(self) -> bool:
        """Whether it trained seeded random heads (the control), not chosen ones."""
        return self.components is not None and self.components.source.startswith("random")

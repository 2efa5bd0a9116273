"""mlp.json: what the MLPs read and write against the number tokens, layer by layer (figure 6), the turning
layers that rule finds, and the layer-by-layer case."""
from __future__ import annotations

from .base import Result


class TurningPoints(Result):
    """Start, inflection and end layers (keyheads.analysis.mlp.turning_points says the rule)."""

    start: int
    inflection: int
    end: int

    def text(self) -> str:
        return f"{self.start}-{self.inflection}-{self.end}"


class MLPCase(Result):
    """One prompt ("4 + 3 = "), its answer, and the numbers each layer's MLP write is closest to."""

    prompt: str
    answer: str
    numbers: list[str]
    top3_per_layer: list[list[str]]
    cosine: list[list[float]]  # [layer][number]


class MLPResult(Result):
    model: str
    data: str
    n_samples: int
    read_point: str  # where the MLP input is read
    curves: dict[str, list[float]]  # curve name -> per-layer mean over the prompts
    operand_contrast: list[float]
    answer_contrast: list[float]
    turning_points: TurningPoints
    rule: str
    case: MLPCase
    # [prompt][layer]: cos(write, W_U[own answer]) - its mean over the other prompts' answers, a shuffled-answer
    # null (keyheads.analysis.mlp); None in records made before it was saved, [] when all prompts share one answer
    answer_specific: list[list[float]] | None = None

"""The settings of the analysis steps: what the knockout, attention and MLP results depend on, each the flags
of its command and a run's section of the same name. Their code is in knockout_run, attention_run and mlp_run;
the settings load without torch, so that keyheads.config.run and keyheads.config.commands validate a config
without a model library."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..mean import KnockoutMean, mean_field
from ..section import Section

SUBSET = "reference prompts used, a seeded subset (None: all)"


class KnockoutSettings(Section):
    """What the knockout results depend on: the flags of `keyheads knockout` (with its files, head choice and
    machine) and a run's `knockout:` section, passed whole to `run_knockout`."""

    k: int = Field(default=20, ge=1, description="the curves knock out k = 0..K heads (capped at the head count)")
    seeds: int = Field(default=5, ge=1, description="random-rank orderings of the curves")
    seed: int = Field(
        default=0, ge=0, description="picks the subset, the random-rank orderings, the control heads and the "
        "transfer sets' prompts")
    limit: int | None = Field(default=300, ge=1, description=SUBSET)
    mean: KnockoutMean = mean_field()
    transfer: bool = Field(default=True, description="the transfer table")
    transfer_by: Literal["task", "template"] = Field(default="task", description="one transfer row per task or per "
                                                                                 "template of transfer_data")
    transfer_n: int | None = Field(default=100, ge=1, description="prompts per generated / benchmark transfer set "
                                                                     "(None: all)")
    transfer_control: bool = Field(default=True, description="also knock out as many random non-key heads on every "
                                                             "transfer set (one more pass each)")
    transfer_draws: int = Field(default=3, ge=1, description="random draws of the transfer control (seeds seed, "
                                                            "seed+1, ...): the band a transfer claim is judged "
                                                            "against needs at least 3")


class AttentionSettings(Section):
    """What the attention results depend on: the flags of `keyheads attention` (with its files, head choice and
    machine) and a run's `attention:` section, passed whole to `run_attention`."""

    limit: int | None = Field(default=1000, ge=1, description=SUBSET + "; the paper's 1000")
    seed: int = Field(default=0, ge=0, description="picks the subset")


class MLPSettings(Section):
    """What the MLP results depend on: the flags of `keyheads mlp` (with its files and machine) and a run's
    `mlp:` section, passed whole to `run_mlp`."""

    limit: int | None = Field(default=1000, ge=1, description=SUBSET)
    seed: int = Field(default=0, ge=0, description="picks the subset")
    case: str | None = Field(default=None, description="prompt of the layer-by-layer case (figure 6c; default: "
                                                  "'4 + 3 = ' after the data's own few-shot prefix)")
    case_answer: str = Field(default="7", description="the case's answer")

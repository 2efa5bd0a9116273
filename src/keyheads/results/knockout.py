"""knockout.json: the knockout curves (figure 3), the key heads' own knockout, and the transfer table with its
cases (figure 4), as `keyheads knockout` and the knockout stage write them.

"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..mean import KnockoutMean
from .base import HeadField, Result


class KnockoutCurves(Result):
    """Accuracy with the top-k heads knocked out, k = 0, 1, ...: by effect rank, and by random orders (one per
    seed; their mean and std)."""

    k: list[int]
    effect_rank: list[float]
    random_rank: list[list[float]]
    random_mean: list[float]
    random_std: list[float]
    effect_order: list[HeadField]
    random_orders: list[list[HeadField]] = []


class HeadsKnockout(Result):
    """The accuracy before and after knocking out one set of heads (the key heads)."""

    heads: list[HeadField]
    accuracy_before: float
    accuracy_after: float
    relative_change: float  # (after - before) / before; NaN when none was right before


def relative(before: float, after: float | None) -> float:
    """(after - before) / before, NaN when nothing was right before (or there is no after)."""
    return (after - before) / before if after is not None and before > 0 else float("nan")


class TransferRow(Result):
    """One transfer set: accuracy before and after the key heads' knockout, and with as many random other heads
    knocked out (the control; None when it did not run)."""

    set: str
    n: int
    accuracy_before: float
    accuracy_after: float
    relative_change: float
    accuracy_random_heads: float | None = None  # the mean over the control's draws
    relative_change_random_heads: float = math.nan
    accuracy_random_draws: list[float] = []  # one per draw; earlier releases made one draw and wrote none
    fallback: str = ""
    note: str = ""

    @classmethod
    def measured(cls, name: str, n: int, before: float, after: float, fallback: str = "", note: str = "",
                 controls: Sequence[float] = ()) -> TransferRow:
        """The row of accuracies measured on set `name` (`controls`: one per random draw), its relative changes
        computed."""
        mean = sum(controls) / len(controls) if controls else None
        return cls(set=name, n=n, accuracy_before=before, accuracy_after=after,
                   relative_change=relative(before, after), accuracy_random_heads=mean,
                   relative_change_random_heads=relative(before, mean), accuracy_random_draws=list(controls),
                   fallback=fallback, note=note)

    def random_draws(self) -> list[float]:
        """The control's accuracy in each draw (a file of an earlier release: its one draw)."""
        if self.accuracy_random_draws:
            return list(self.accuracy_random_draws)
        return [] if self.accuracy_random_heads is None else [self.accuracy_random_heads]


class Case(Result):
    """A figure-4 case: the input and the top-5 next tokens (with probabilities) before and after the knockout."""

    name: str
    prompt: str
    answer: str
    before: list[tuple[str, float]]
    after: list[tuple[str, float]]

    def text(self, show_chars: int = 300) -> str:
        shown = self.prompt if len(self.prompt) <= show_chars else "…" + self.prompt[-show_chars:]
        lines = [f"[{self.name}]  answer: {self.answer}", f"> Input: {shown!r}"]
        for label, top in (("before knockout", self.before), ("after knockout", self.after)):
            lines.append(f"  {label}:  > Next token: {top[0][0]!r}")
            lines.append("    > Top-5 prediction probability: "
                         + ", ".join(f"{t!r} {p:.2%}" for t, p in top))
        return "\n".join(lines)


class Transfer(Result):
    """The transfer table: the identification data first (the reference row), then the other sets."""

    heads: list[HeadField]
    random_heads: list[HeadField] | None  # the control's first draw; None when the control did not run
    random_draws: list[list[HeadField]] = []  # every draw (earlier releases: none written, one made)
    rows: list[TransferRow]
    cases: list[Case] = []


class KnockoutResult(Result):
    model: str
    data: str
    n_samples: int
    n_counterfactual: int
    mean: KnockoutMean
    effects: str | None  # the effects.json the curves ranked heads by
    config: dict[str, Any]  # the files and settings of the call, as given
    curves: KnockoutCurves | None = None  # absent without an effects file (or with k 0)
    key_heads: HeadsKnockout
    transfer: Transfer | None = None  # absent when transfer was off
    notes: list[str] = []
    seconds: float | None = None  # the stage's time, saved here by releases before the stage records


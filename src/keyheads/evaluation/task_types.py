"""What a benchmark is to the runner: items with prompts, how a batch is run, how it is scored.

A `Task` scores each variant on its own (`run`, under the variant's edits). A `PairwiseTask`
compares each variant with a reference variant instead (`run_pair`; it installs both variants'
edits itself), so the runner dispatches on the type.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..data.benchmarks import Record
from ..models.model import HookedModel
from .engine import PrefixKV
from .extract import wilson
from .settings import EvalSettings
from .variants import Prepared


@dataclass
class Item:
    record: Record
    prompt: str


class Task:
    """One benchmark: `items` builds the prompts, `run` scores a batch, `summarize` aggregates."""

    name: str

    @property
    def cache_name(self) -> str:
        """The benchmark whose per-item cache holds this task's items (its own, unless it is part of another)."""
        return self.name
    split: str
    exemplars: list[Record]
    items: list[Item]
    # run() takes every pending item of a group at once and keeps batch_size in flight
    continuous: bool = False

    def group(self, item: Item) -> str:
        """Items of one group share a few-shot prefix; batches do not mix groups."""
        return item.record.subject or ""

    def settings(self, tokenizer: Any, cfg: EvalSettings) -> dict:
        """Everything besides model and prompt that changes the raw result (part of the cache key)."""
        raise NotImplementedError

    def run(self, model: HookedModel, items: Sequence[Item], prefix: PrefixKV,
            cfg: EvalSettings, batch_size: int) -> Iterable[tuple[int, dict]]:
        """(position in `items`, raw result to cache: generated text, letter logits), in the order
        the items end."""
        raise NotImplementedError

    def score(self, item: Item, row: dict) -> dict:
        """The cached row plus prediction and correctness."""
        raise NotImplementedError

    def summarize(self, items: Sequence[Item], rows: Sequence[dict]) -> dict:
        n, correct = len(rows), sum(bool(r["correct"]) for r in rows)
        lo, hi = wilson(correct, n)
        return {"benchmark": self.name, "split": self.split, "n": n, "correct": correct,
                "accuracy": correct / n if n else 0.0, "ci95": [lo, hi], "few_shot": len(self.exemplars),
                "exemplars": [e.id for e in self.exemplars]}

    def wrong_case(self, item: Item, row: dict) -> dict:
        raise NotImplementedError


class PairwiseTask(Task):
    """A task measured against a reference variant (the table's first row), not by correctness.

    The runner sets `reference` before `settings` and `run_pair` are called; the reference's
    fingerprint is part of the cache key.
    """

    reference: Prepared | None = None

    def the_reference(self) -> Prepared:
        if self.reference is None:
            raise ValueError(f"{self.name}: no reference variant set (the runner sets it before scoring)")
        return self.reference

    def run(self, model: HookedModel, items: Sequence[Item], prefix: PrefixKV,
            cfg: EvalSettings, batch_size: int) -> Iterable[tuple[int, dict]]:
        raise TypeError(f"{self.name} compares two variants: call run_pair")

    def run_pair(self, prepared: Prepared, items: Sequence[Item], cfg: EvalSettings) -> list[dict]:
        """Raw results of `prepared` against `reference`, each under its own edits."""
        raise NotImplementedError

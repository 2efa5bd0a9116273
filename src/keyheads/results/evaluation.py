"""The evaluation's files: results.json (the table over every evaluated row) and each row's summary.json and
BENCHMARK.json, as keyheads.evaluation.runner writes them.

A benchmark's summary has the keys its kind of task writes (accuracy and its interval for the scored sets, KL
and perplexity for generic-kl, the timing for every one) and a task may add its own. A row's `info` is what its
variant kind says about it (the variant, the heads knocked out, the training run) and the caller's own notes.
"""
from __future__ import annotations

from pydantic import ConfigDict

from .base import AsSaved, HeadField, Number, Result
from .finetune import ComponentsField


class BenchmarkSummary(Result):
    """One row's result on one benchmark (its fields in the order the tasks write them)."""

    model_config = ConfigDict(extra="allow")  # a task's own keys

    benchmark: str | None = None
    split: str | None = None
    n: int | None = None
    kind: str | None = None  # "drift" for generic-kl
    correct: int | None = None
    accuracy: Number | None = None
    ci95: list[Number] | None = None  # Wilson
    few_shot: int | None = None
    exemplars: list[str] | str | None = None
    cot: bool | None = None
    no_number: int | None = None
    hit_length_limit: int | None = None
    subjects: dict[str, dict[str, Number]] | None = None
    macro_accuracy: Number | None = None
    kl: Number | None = None  # generic-kl: from the reference row, per position
    kl_ci95: list[Number] | None = None
    perplexity: Number | None = None
    perplexity_ci95: list[Number] | None = None
    positions: int | None = None
    tokens: int | None = None
    reference: str | None = None
    timing: dict[str, Number] | None = None
    max_new_tokens: int | None = None
    shard: list[int] | None = None  # (k, n) of a call that computed one shard and scored nothing

    def scored(self) -> tuple[float, tuple[float, float]]:
        """(accuracy, its Wilson interval) of a scored set."""
        if self.accuracy is None or self.ci95 is None:
            raise ValueError(f"{self.benchmark}: a summary without an accuracy and its interval")
        return self.accuracy, (self.ci95[0], self.ci95[1])

    def drift(self) -> tuple[float, tuple[float, float], float, tuple[float, float]]:
        """(KL, its interval, perplexity, its interval) of generic-kl."""
        if self.kl is None or self.kl_ci95 is None or self.perplexity is None or self.perplexity_ci95 is None:
            raise ValueError(f"{self.benchmark}: a summary without KL and perplexity")
        return self.kl, (self.kl_ci95[0], self.kl_ci95[1]), self.perplexity, (self.perplexity_ci95[0],
                                                                                self.perplexity_ci95[1])


class VariantOptions(AsSaved):
    """A variant kind's options as the user gave them: the knockout mean and the adapter path typed, the kind's
    other options kept as written."""

    mean: str | None = None
    path: str | None = None


class VariantSpec(Result):
    """The variant a row was evaluated from (keyheads.evaluation.variants.Variant.spec)."""

    kind: str
    model: str
    options: VariantOptions = VariantOptions()


class KnockoutInfo(Result):
    """What a knockout row knocked out, and with which mean."""

    heads: list[HeadField] = []
    mlps: list[int] = []
    pairs: str | None = None
    counterfactual_prompts: int | None = None
    mean: str | None = None
    aligned_positions: int | None = None


class FinetuneInfo(Result):
    """The fine-tuning run an adapter row was made by."""

    method: str | None = None
    components: ComponentsField | None = None


class VariantInfo(Result):
    """What a row's variant kind recorded; a caller's Prepared.info may add its own notes."""

    model_config = ConfigDict(extra="allow")

    train_speed: str | None = None
    tuned_params: str | None = None
    finetune: FinetuneInfo | None = None
    knockout: KnockoutInfo | None = None
    variant: VariantSpec | None = None


class VariantResult(Result):
    """One evaluated row: its label, its cache identity and its summaries by benchmark (summary.json)."""

    label: str
    fingerprint: str | None = None
    info: VariantInfo = VariantInfo()
    benchmarks: dict[str, BenchmarkSummary]

    def on(self, benchmark: str) -> BenchmarkSummary | None:
        """Its summary on `benchmark`, None when it was not evaluated there."""
        return self.benchmarks[benchmark] if benchmark in self.benchmarks else None


class SavedEvalSettings(AsSaved):
    """results.json's `config`: the EvalSettings as saved (keyheads.evaluation.settings); the benchmarks typed, the
    other keys kept as written."""

    benchmarks: list[str] = []


class EvalResults(Result):
    """results.json: the settings and every row, the first the reference of the Δ columns."""

    config: SavedEvalSettings
    variants: list[VariantResult]

    @property
    def benchmarks(self) -> list[str]:
        """The benchmarks asked for, in their order."""
        return self.config.benchmarks

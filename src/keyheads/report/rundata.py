"""What the stages wrote (their typed results, keyheads.results), arranged as the sections and the findings share
it: the eval table with each row's kind and training run, the identifications set by set.

Nothing here imports torch: the report only reads files, and a run folder copied to a laptop must
render there. The benchmark names are keyheads.evaluation.settings's, which loads without torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..effects import Effects
from ..evaluation.settings import CHOICE, DRIFT
from ..heads import Head
from ..results.evaluation import BenchmarkSummary, VariantInfo
from ..results.finetune import FinetuneResult
from ..runfolder import RunFolder
from .markup import is_num
from .stats import Band, PairedTest, band, paired_sets, seed_free, seed_groups, with_holm


def precise_runs(runs: dict[str, FinetuneResult]) -> dict[str, FinetuneResult]:
    """Precise SFT on chosen (not random) components: the paper's method and its ablation."""
    return {k: v for k, v in runs.items() if v.method == "precise" and not v.random_heads}


def main_precise(runs: dict[str, FinetuneResult]) -> str | None:
    """The precise run that stands for the method in the findings: among runs named 'precise*'
    (the pipeline's naming; else all), the first by name that tunes heads only, as the paper's
    default does (its MLP variants are ablations)."""
    chosen = precise_runs(runs)
    named = [k for k in chosen if k.startswith("precise")] or list(chosen)
    heads_only = [k for k in named if not _mlps(chosen[k])]
    names = heads_only or named
    return names[0] if names else None


def precise_like(runs: dict[str, FinetuneResult], control: str) -> str | None:
    """The precise run on chosen components that tunes as many heads and MLPs as the random control `control`:
    the key heads against random heads is a fair comparison only at the same size (random@32 against
    precise@32, not against the 8 key heads)."""
    size = _size(runs[control])
    return next((k for k, v in precise_runs(runs).items() if _size(v) == size), None)


def _size(run: FinetuneResult) -> tuple[int, int]:
    return (len(run.components.heads), len(run.components.mlps)) if run.components is not None else (0, 0)


def _mlps(run: FinetuneResult) -> tuple[int, ...]:
    return run.components.mlps if run.components is not None else ()


def row_mean(info: VariantInfo) -> str | None:
    """The mean a knockout row of the eval table used, "aligned" or "global" (keyheads.knockout): its results'
    else its variant's option; None when neither says."""
    if info.knockout is not None and info.knockout.mean:
        return info.knockout.mean
    mean = info.variant.options.mean if info.variant is not None else None
    return mean or None


def first_of(runs: dict[str, FinetuneResult], method: str) -> str | None:
    return next((k for k, v in runs.items() if v.method == method), None)


@dataclass
class EvalRow:
    label: str
    kind: str                                    # model | knockout | adapter | ...
    benchmarks: dict[str, BenchmarkSummary]
    run: str | None = None                       # the finetune/<run> folder of an adapter row
    info: VariantInfo = field(default_factory=VariantInfo)

    @property
    def mean(self) -> str | None:
        """A knockout row's mean ("aligned" or "global"), when its results say."""
        return row_mean(self.info) if self.kind == "knockout" else None

    def summary(self, benchmark: str) -> BenchmarkSummary | None:
        return self.benchmarks[benchmark] if benchmark in self.benchmarks else None

    def acc(self, benchmark: str) -> float | None:
        s = self.summary(benchmark)
        return s.accuracy if s is not None and is_num(s.accuracy) else None


@dataclass
class EvalTable:
    benchmarks: list[str]
    rows: list[EvalRow]

    @property
    def base(self) -> EvalRow | None:
        """The reference row: the plain model (the evaluator's first row otherwise)."""
        return next((r for r in self.rows if r.kind == "model"), self.rows[0] if self.rows else None)

    def of_kind(self, kind: str) -> list[EvalRow]:
        return [r for r in self.rows if r.kind == kind]

    def of_run(self, name: str | None) -> EvalRow | None:
        return next((r for r in self.rows if name is not None and r.run == name), None)

    def math(self) -> list[str]:
        return [b for b in self.benchmarks if b not in CHOICE and b != DRIFT]

    def drift(self, row: EvalRow) -> BenchmarkSummary | None:
        """The row's generic-kl summary (kl, kl_ci95, perplexity, ...), when it was measured."""
        s = row.summary(DRIFT)
        return s if s is not None and is_num(s.kl) else None

    def generic(self) -> list[str]:
        return [b for b in self.benchmarks if b in CHOICE]

    def scored(self) -> list[str]:
        """The benchmarks scored right or wrong item by item: the math sets, then the generic ones."""
        return self.math() + self.generic()

    def mean_delta(self, row: EvalRow, benchmarks: list[str]) -> float | None:
        """Mean accuracy change from the base row over `benchmarks` both rows have."""
        base = self.base
        if base is None:
            return None
        pairs = [(row.acc(b), base.acc(b)) for b in benchmarks]
        diffs = [a - c for a, c in pairs if a is not None and c is not None]
        return sum(diffs) / len(diffs) if diffs else None


def _kind(info: VariantInfo) -> str:
    if info.variant is not None and info.variant.kind:
        return info.variant.kind
    if info.finetune is not None:
        return "adapter"
    return "knockout" if info.knockout is not None else "model"


def _run_of(info: VariantInfo, runs: dict[str, FinetuneResult]) -> str | None:
    """The finetune/<name> folder an adapter row was evaluated from: by the folder's name (the
    path itself may be from another machine), else by method when only one run has it."""
    variant = info.variant
    path = (variant.options.path or variant.model) if variant is not None else None
    if path:
        name = Path(str(path)).name
        return name if name in runs else None
    method = info.finetune.method if info.finetune is not None else None
    same = [k for k, v in runs.items() if v.method == method]
    return same[0] if method and len(same) == 1 else None


def eval_table(run: RunFolder) -> EvalTable | None:
    data = run.eval_record
    if data is None or not data.variants:
        return None
    runs = run.finetune_records
    benchmarks = data.benchmarks
    rows = []
    for v in data.variants:
        kind = _kind(v.info)
        rows.append(EvalRow(v.label, kind, v.benchmarks, _run_of(v.info, runs) if kind == "adapter" else None, v.info))
        benchmarks += [b for b in rows[-1].benchmarks if b not in benchmarks]
    return EvalTable(benchmarks, rows)


def paired_family(run: RunFolder, table: EvalTable) -> dict[tuple[str, str], PairedTest]:
    """Every row against the base row, item by item, on every scored benchmark for which both wrote the
    items they got wrong (eval/<row>/<benchmark>.wrong.jsonl) over the same n items: {(label, benchmark):
    test}. The tests are one family, the whole table: each p is also given Holm-adjusted over all of them."""
    base = table.base
    if base is None:
        return {}
    tests = {}
    for row in table.rows:
        if row is base:
            continue
        for b in table.scored():
            test = _paired(run, base, row, b)
            if test is not None:
                tests[(row.label, b)] = test
    return with_holm(tests)


def _paired(run: RunFolder, base: EvalRow, row: EvalRow, bench: str) -> PairedTest | None:
    if bench not in base.benchmarks or bench not in row.benchmarks:
        return None
    n, n_row = base.benchmarks[bench].n, row.benchmarks[bench].n
    if not isinstance(n, int) or n <= 0 or n != n_row:
        return None
    base_wrong, row_wrong = run.wrong_ids(base.label, bench), run.wrong_ids(row.label, bench)
    if base_wrong is None or row_wrong is None or len(base_wrong | row_wrong) > n:
        return None
    return paired_sets(base_wrong, row_wrong, n)


def seed_sets(rows: list[EvalRow]) -> list[tuple[str, list[EvalRow]]]:
    """The rows that are one control run with several seeds (run names, else labels, of one kind that differ
    only in a seed: random@40, random@40-seed1, ...): [(the label without its seed, the rows)]."""
    names = [f"{r.kind} {r.run or r.label}" for r in rows]
    return [(seed_free(rows[idx[0]].label), [rows[i] for i in idx]) for idx in seed_groups(names).values()]


def delta_band(table: EvalTable, rows: list[EvalRow], benchmarks: list[str]) -> Band | None:
    """Mean and range over `rows` (the seeds of one control) of their mean accuracy change from the base
    row over `benchmarks`."""
    deltas = [d for d in (table.mean_delta(r, benchmarks) for r in rows) if d is not None]
    return band(deltas) if deltas else None


# ---- the identifications on several sets (identify/ and identify/NAME/) ---------------------------------

MAIN_SET = "main"  # the run's own pairs (identify/), beside the also_identify sets


@dataclass
class IdentifiedSet:
    """One identification: its key heads in rank order and its effects.json."""

    name: str
    key_heads: list[Head]
    effects: Effects

    @property
    def strongest(self) -> tuple[Head, float] | None:
        """The head of the largest effect, the most negative (patching it away lowers the answer most)."""
        found = [(Head(l, h), e) for l, row in enumerate(self.effects.heads) for h, e in enumerate(row) if is_num(e)]
        return min(found, key=lambda he: he[1]) if found else None


def identified_sets(run: RunFolder) -> list[IdentifiedSet]:
    """The main identification, then the identify/NAME ones (those the config lists, in its order, when it
    does: a set taken out of also_identify leaves its folder behind), when at least one of those was written."""
    others = run.also_identify_records
    listed = run.config_record.also_identify if run.config_record is not None else None
    if listed is not None:
        others = {name: others[name] for name in listed if name in others}
    if not others:
        return []
    keys, effects = run.key_heads_record, run.effects_record
    main = [IdentifiedSet(MAIN_SET, keys.heads_ranked, effects)] if keys is not None and effects is not None else []
    return main + [IdentifiedSet(name, r.key_heads.heads_ranked, r.effects) for name, r in others.items()]


@dataclass
class Overlap:
    """Two sets' top-k key heads in common (k: the smaller key-head count of the two)."""

    a: str
    b: str
    k: int
    shared: list[Head]


def overlaps(sets: list[IdentifiedSet]) -> list[Overlap]:
    """Every pair of sets, in order."""
    out = []
    for i, a in enumerate(sets):
        for b in sets[i + 1:]:
            k = min(len(a.key_heads), len(b.key_heads))
            top_b = set(b.key_heads[:k])
            out.append(Overlap(a.name, b.name, k, [h for h in a.key_heads[:k] if h in top_b]))
    return out

"""Run the benchmarks for one or more variants, with a per-item cache, and write the table.

Per-item results go to ``<cache_dir>/<benchmark>.sqlite`` (append-only, resumable, shared
by runs; default $KEYHEADS_CACHE/eval). Run folder layout (``out``):
    <variant>/<benchmark>.json       accuracy, 95% CI, settings (MMLU: per subject)
    <variant>/<benchmark>.wrong.jsonl the wrong cases, for inspection
    results.json, table.md, table.csv the table over all variants (first row = reference)
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tqdm.auto import tqdm

from .. import (
    distributed,
    models,  # models.load_placed looked up at call time: tests replace what it calls
)
from ..io import atomic_write_text, write_json, write_jsonl
from ..mean import DEFAULT_MEAN, KnockoutMean
from ..models.model import HookedModel
from ..results.evaluation import BenchmarkSummary, EvalResults, VariantResult
from ..runfolder import RESULTS_JSON
from .cache import ResultCache, item_key
from .engine import PrefixKV
from .settings import EvalSettings, check_benchmarks, check_shard
from .table import to_csv, to_markdown
from .task_types import PairwiseTask, Task
from .tasks import MathTask, make_task
from .variants import Prepared, Variant, prepare


def slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", label).strip("_") or "model"


def cache_folder(cache_dir: str | Path | None) -> Path:
    if cache_dir:
        return Path(cache_dir)
    return models.cache_root() / "eval"


def batches(items: list, size: int, group: Callable) -> list[list]:
    """Consecutive runs of at most `size` items of the same group."""
    runs: list[list] = []
    for item in items:
        if runs and len(runs[-1]) < size and group(runs[-1][0]) == group(item):
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def run_task(prepared: Prepared, task: Task, cfg: EvalSettings, cache: ResultCache,
             reference: Prepared | None = None, *, batch_size: int = 16, progress: bool = True,
             shard: tuple[int, int] | None = None) -> tuple[list[dict], dict]:
    """Score every item of `task`, computing only those not in `cache`; -> (rows, timing).

    A pairwise task (generic-kl) compares `prepared` with `reference` (default: itself) and
    installs each one's edits itself.
    """
    pairwise = isinstance(task, PairwiseTask)
    if isinstance(task, PairwiseTask):
        task.reference = reference or prepared
    settings = task.settings(prepared.tokenizer, cfg)
    keys = [item_key(prepared.fingerprint, task.cache_name, it.prompt, settings) for it in task.items]
    pending = [(k, it) for k, it in zip(keys, task.items) if k not in cache and in_shard(k, shard)]
    # A batch never mixes groups (MMLU subjects, whose few-shot prefixes differ), and within a
    # group prompts of similar length go together, so that little is spent on padding.
    pending.sort(key=lambda p: (task.group(p[1]), len(p[1].prompt), p[1].prompt))
    start = time.time()
    right = done = 0
    if pending:
        bar = tqdm(total=len(pending), desc=f"{prepared.label} {task.name}", unit="q", disable=not progress,
                   dynamic_ncols=True)
        model = prepared.model  # built here, once an item needs it
        prefix = PrefixKV(model, keep=prepared.end_window)
        right = done = 0
        with model.hooks(edit={} if pairwise else prepared.edits):
            # a continuous task takes a whole group and keeps batch_size of it in flight
            size = len(pending) if task.continuous else batch_size
            for batch in batches(pending, size, lambda p: task.group(p[1])):
                cache.refresh()  # another run sharing the cache may have done some of these
                todo = [(k, it) for k, it in batch if k not in cache]
                bar.update(len(batch) - len(todo))
                items = [it for _, it in todo]
                results: Iterable[tuple[int, dict]] = []
                if not todo:
                    pass
                elif isinstance(task, PairwiseTask):
                    results = enumerate(task.run_pair(prepared, items, cfg))
                else:
                    results = task.run(model, items, prefix, cfg, batch_size)
                for j, r in results:  # saved as each one ends: an interruption loses no finished item
                    cache.add([{"key": todo[j][0], "variant": prepared.label, **r}])
                    right += bool(task.score(items[j], r)["correct"])
                    done += 1
                    bar.update(1)
                    bar.set_postfix(acc=f"{right / done:.3f}")
        bar.close()
    timing = {"computed": done, "cached": len(keys) - done, "seconds": round(time.time() - start, 1)}
    if shard is not None:  # other shards' items may not be there yet: nothing to score
        return [], timing
    return [task.score(it, _cached(cache, k)) for k, it in zip(keys, task.items)], timing


def _cached(cache: ResultCache, key: str) -> dict:
    if key not in cache:  # every item was computed above, or found in the cache
        raise RuntimeError(f"no cached result for item {key}")
    return cache[key]


def in_shard(key: str, shard: tuple[int, int] | None) -> bool:
    """Whether the item with this (hex) key belongs to shard k of n; every item is in exactly one."""
    return shard is None or int(key[:12], 16) % shard[1] == shard[0]


def evaluate_prepared(prepared: Prepared, cfg: EvalSettings, out: str | Path,
                      tasks: dict[str, Task] | None = None, reference: Prepared | None = None, *,
                      data_dir: str | None = None, batch_size: int = 16, cache_dir: str | Path | None = None,
                      progress: bool = True, shard: tuple[int, int] | None = None) -> VariantResult:
    """Evaluate one prepared variant on cfg.benchmarks; writes its folder; -> its row.

    `reference` is the table's first row, against which generic-kl measures drift."""
    out = Path(out)
    tasks = tasks if tasks is not None else {}
    folder = out / slug(prepared.label)
    summaries = {}
    for name in check_benchmarks(cfg.benchmarks):
        if name not in tasks:
            tasks[name] = make_task(name, cfg, data_dir)
        task = tasks[name]
        cache = ResultCache(cache_folder(cache_dir) / f"{task.cache_name}.sqlite")
        rows, timing = run_task(prepared, task, cfg, cache, reference, batch_size=batch_size, progress=progress,
                                shard=shard)
        if shard is not None:
            summaries[name] = {"timing": timing, "shard": list(shard)}
            continue
        summary = task.summarize(task.items, rows)
        summary["timing"] = timing
        if isinstance(task, MathTask):  # scored by generation: math and arith
            summary["max_new_tokens"] = cfg.new_tokens(name)
        write_json(folder / f"{name}.json", BenchmarkSummary.from_json(summary).to_json())
        write_jsonl(folder / f"{name}.wrong.jsonl",
                    (task.wrong_case(it, r) for it, r in zip(task.items, rows) if not r["correct"]))
        summaries[name] = summary
    result = VariantResult.from_json({"label": prepared.label, "fingerprint": prepared.fingerprint,
                                      "info": prepared.info, "benchmarks": summaries})
    if shard is None:
        write_json(folder / "summary.json", result.to_json())
    return result


def write_table(results: Sequence[VariantResult], cfg: EvalSettings, out: str | Path) -> str:
    out = Path(out)
    md = to_markdown(results, cfg.benchmarks)
    table = EvalResults(config=cfg.to_json(), variants=list(results))
    write_json(out / RESULTS_JSON, table.to_json())
    atomic_write_text(out / "table.md", md)
    atomic_write_text(out / "table.csv", to_csv(results, cfg.benchmarks))
    return md


def evaluate(variants: Sequence[Variant | Prepared], cfg: EvalSettings, out: str | Path,
             loader: Callable[[str], HookedModel] | None = None, mean: KnockoutMean = DEFAULT_MEAN, *,
             reference: Variant | None = None, data_dir: str | None = None, batch_size: int = 16,
             cache_dir: str | Path | None = None, progress: bool = True,
             shard: tuple[int, int] | None = None) -> list[VariantResult]:
    """Evaluate each variant (the first is the reference for the Δ columns) and write the table.
    A knockout variant whose options name no mean takes `mean`. `reference`, when given, is what generic-kl
    measures drift against instead of the first variant: prepared (its model loaded) but not evaluated, so that a
    study's cell evaluates one row against a base row another cell evaluated (keyheads.study.cells).

    The caller's concerns, none of which changes a number: `data_dir` (the benchmarks folder; None:
    $KEYHEADS_DATA, else the hub), `batch_size` (prompts per forward pass), `cache_dir` (the per-item cache,
    shared by runs; None: $KEYHEADS_CACHE/eval), `progress` (bars) and `shard` ((k, n): compute only shard k
    of n into the cache, so that n processes split the work; such a call writes no table).
    Under several processes (accelerate launch, torchrun) every rank calls it with shard None: the
    items are split by rank, the main process writes the table and returns it; the other ranks
    return their shard's timings.
    """
    check_shard(shard)
    loaded: dict[str, HookedModel] = {}

    def load_once(name: str) -> HookedModel:  # variants of one model share its weights
        if name not in loaded:
            if loader is None:
                loaded[name], _ = models.load_placed(name)
            else:
                loaded[name] = loader(name)
        return loaded[name]

    check_benchmarks(cfg.benchmarks)
    # Started as several processes without an explicit shard: each computes its shard into the
    # shared cache, then the main one scores everything from there and writes the table.
    together = shard is None and distributed.world() > 1
    mine = (distributed.rank(), distributed.world()) if together else shard

    def row(prepared: Prepared, shard: tuple[int, int] | None) -> VariantResult:
        return evaluate_prepared(prepared, cfg, out, tasks, (drift_from or ready)[0], data_dir=data_dir,
                                 batch_size=batch_size, cache_dir=cache_dir, progress=progress, shard=shard)

    tasks: dict[str, Task] = {}
    results, ready = [], []
    drift_from = [prepare(reference, load_once)] if reference is not None else []  # never a row of the table
    for v in variants:
        if isinstance(v, Variant) and v.kind == "knockout":  # the caller's mean where the row names none
            v = v.with_defaults(mean=mean)
        prepared = v if isinstance(v, Prepared) else prepare(v, load_once)
        if isinstance(v, Variant):
            prepared.info.setdefault("variant", v.spec())
        ready.append(prepared)
        before = set(loaded)
        results.append(row(prepared, mine))
        if prepared is not ready[0]:  # the first row stays: every drift measurement compares with it
            # Free this row's copy of the weights before the next row builds its own; the main
            # process of a multi-process run scores from the cache below and builds nothing.
            prepared.release()
            for name in set(loaded) - before:  # loaded while building this row, for it alone
                del loaded[name]
    if together:
        distributed.barrier()  # every shard is in the cache now
        if distributed.is_main():
            results = [row(p, None) for p in ready]
            write_table(results, cfg, out)
        distributed.barrier()  # the table exists before any rank moves on
    elif shard is None:
        write_table(results, cfg, out)
    return results

"""The knockout step: mean-ablation curves (effect-rank vs random-rank), the key heads' knockout and the
transfer table, written as JSON, CSV and PNG into the run folder."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..data.benchmarks import DataNotFound, data_dir_from
from ..distributed import is_main, world
from ..heads import Head
from ..io import atomic_path, atomic_write_text, file_sha256, write_json
from ..knockout import Knockout, compute_means
from ..log import logger
from ..mean import KnockoutMean
from ..models.model import HookedModel
from ..models.prompt_set import PromptSet
from ..plotting import write_csv
from ..results.knockout import Case, HeadsKnockout, KnockoutCurves, KnockoutResult, Transfer, TransferRow
from ..runfolder import KNOCKOUT_JSON
from ..selection import HeadChoice, Notes, choose_heads
from . import transfer as tr
from .common import (
    alignment_warning,
    all_heads,
    fallback_note,
    knockout_subset,
    load_samples,
    read_pair_list,
)
from .knockout_curves import CurveSettings, knockout_curves, plot_curves, random_order, set_accuracies
from .resumable import resumable_map
from .settings import KnockoutSettings

MEANS_PARTIAL = "head_means.partial.safetensors"
TRANSFER_PARTIAL = "transfer.partial.json"


@dataclass(frozen=True)
class _Call:
    """One knockout run: the settings and what goes with them (files, heads, speed)."""

    data: str
    out: str
    heads: HeadChoice
    settings: KnockoutSettings
    transfer_data: str | None
    data_dir: str | None
    batch_size: int
    progress: bool

    def record(self) -> dict:
        """knockout.json's "config": the settings whole, with the call's files, heads and batch size."""
        return {**self.settings.to_json(), "data": self.data, "out": self.out, "selection": self.heads.record(),
                "transfer_data": self.transfer_data, "data_dir": self.data_dir, "batch_size": self.batch_size}

    def key_record(self) -> dict:
        """What a checkpoint's results depend on: record() less where it is written."""
        return {k: v for k, v in self.record().items() if k != "out"}


def run_knockout(model: HookedModel, pairs: str | Path, out: str | Path, heads: HeadChoice,
                 settings: KnockoutSettings, *, transfer_data: str | None = None, data_dir: str | None = None,
                 batch_size: int = 32, progress: bool = True) -> KnockoutResult:
    """The curves, the key heads' knockout and the transfer table of `heads` on the pairs file `pairs`
    (`transfer_data`: another pairs file, one more transfer row per task or template; `data_dir`: the
    benchmark folder of the SVAMP and GSM8K rows), written into `out`."""
    cfg = _Call(str(pairs), str(out), heads, settings, transfer_data, data_dir, batch_size, progress)
    t0 = time.time()
    out = Path(out)
    notes = Notes()
    cf = [pair.counterfactual for pair in read_pair_list(cfg.data)]  # read_pairs requires every one
    notes.add(alignment_warning(model, cf) if settings.mean == "aligned" else "")
    key_heads, effects = choose_heads(model, heads)
    samples = load_samples(model, cfg.data, settings.limit, settings.seed)
    answers = [s.answer_id for s in samples]
    candidates = all_heads(model)
    if effects is None and settings.k:
        notes.add("no --effects: the effect-rank / random-rank curves are skipped")
    k = min(settings.k, len(candidates))
    if settings.k > len(candidates):
        notes.add(f"--k {settings.k} is more than the model's {len(candidates)} heads: capped at {k}")
    logger.info("%s: %d reference prompts from %s; means over %d counterfactual prompts", model.name, len(samples),
                cfg.data, len(cf))

    # one pass over the counterfactual prompts gives the means of every head
    full = cached_means(model, cf, candidates, settings.mean, out / MEANS_PARTIAL, batch_size, progress)
    prompts = PromptSet(model, [s.prompt for s in samples], batch_size)
    notes.add(fallback_note(full, prompts).text("reference prompts"))
    curves_found: KnockoutCurves | None = None
    if effects is not None and k:
        # the key heads' own knockout rides along with the curves' sets
        # everything the accuracies depend on: the settings, the data, the model and its ranking
        key = json.dumps([cfg.key_record(), file_sha256(cfg.data), model.name, [h.to_json() for h in effects.ranked()]],
                         sort_keys=True, default=str)
        curves = knockout_curves(model, prompts, answers, full, effects.ranked(), candidates,
                                 CurveSettings(k=k, seeds=settings.seeds, seed=settings.seed), progress=progress,
                                 extra=[key_heads], checkpoint=(out / "knockout_curves.partial.json",
                                                                hashlib.sha256(key.encode()).hexdigest()))
        base, after = curves.effect[0], curves.extra[0]
        curves_found = KnockoutCurves(k=curves.ks, effect_rank=curves.effect, random_rank=curves.random,
                                      random_mean=curves.random_mean.tolist(), random_std=curves.random_std.tolist(),
                                      effect_order=curves.effect_order, random_orders=curves.random_orders)
        if is_main():
            _write_curves(out, curves, model.name)
    else:
        base, after = set_accuracies(model, prompts, answers, full, [[], key_heads])
    knocked = HeadsKnockout(heads=key_heads, accuracy_before=base, accuracy_after=after,
                            relative_change=(after - base) / base if base else float("nan"))
    transfer = _run_transfer(model, cfg, full, key_heads, notes, out) if settings.transfer else None
    result = KnockoutResult(model=model.name, data=cfg.data, n_samples=len(samples), n_counterfactual=len(cf),
                            mean=settings.mean, effects=heads.effects, config=cfg.record(), key_heads=knocked,
                            notes=list(notes))
    if curves_found is not None:  # set only when there are some: the file has no "curves" otherwise
        result.curves = curves_found
    if transfer is not None:  # None when transfer is off, and on the processes that do not write
        result.transfer = transfer
    if not is_main():  # every process holds the whole result but the transfer table; one writes it
        return result
    write_json(out / KNOCKOUT_JSON, result.to_json())  # no timing inside: the same inputs give the same bytes
    for partial in ("knockout_curves.partial.json", TRANSFER_PARTIAL, MEANS_PARTIAL):
        (out / partial).unlink(missing_ok=True)
    logger.info("wrote %s/%s%s%s (%.0f s)", out, KNOCKOUT_JSON,
                ", knockout_curves.csv, knockout_curves.png" if result.curves is not None else "",
                ", transfer.csv, transfer_cases.txt" if settings.transfer else "", time.time() - t0)
    return result


def describe(result: KnockoutResult) -> str:
    """What a knockout run found, for people: the curves, the key heads' knockout and the transfer table."""
    parts = [_format_curves(result.curves)] if result.curves is not None else []
    k = result.key_heads
    heads = ",".join(map(str, k.heads))
    base, after, rel = k.accuracy_before, k.accuracy_after, k.relative_change
    parts.append(f"knockout of {len(k.heads)} heads [{heads}]: accuracy {base:.1%} -> {after:.1%} "
                 + (f"({rel:+.1%} relative)" if base else "(none right before: no relative change)"))
    if result.transfer is not None:
        table = tr.format_table(result.transfer.rows)
        cases = "\n\n".join(c.text() for c in result.transfer.cases)
        parts.append(f"\ntransfer: knocking out {len(k.heads)} key heads [{heads}]\n{table}\n\n{cases}")
    return "\n".join(parts)


def cached_means(model: HookedModel, cf: list[str], heads, mean: KnockoutMean, path: Path, batch_size: int,
                 progress: bool = True) -> Knockout:
    """Every head's mean output over the counterfactual prompts, kept beside the results until the stage
    ends: on a large model this pass is long, and an interrupted stage resumes after it."""
    key = hashlib.sha256(json.dumps([model.name, cf, batch_size, mean]).encode()).hexdigest()
    try:
        with safe_open(str(path), "pt") as f:
            if (f.metadata() or {}).get("key") == key:
                return Knockout.from_state(heads, (), {name: f.get_tensor(name) for name in f.keys()},
                                           mean=mean)
    except (OSError, SafetensorError, KeyError, ValueError):
        pass  # absent, truncated or of other settings: computed again
    full = compute_means(model, cf, heads=heads, batch_size=batch_size, mean=mean, progress=progress)
    if is_main():
        with atomic_path(path) as tmp:
            save_file(full.to_state(), str(tmp), metadata={"key": key})
    return full


def _write_curves(out: Path, curves, model_name: str) -> None:
    seeds = len(curves.random)
    header = ["k", "effect_rank_head", "effect_rank_accuracy", "random_mean", "random_std"] + \
             [f"random_seed{s}" for s in range(seeds)]
    rows = []
    for i, k in enumerate(curves.ks):
        head = str(curves.effect_order[k - 1]) if k else ""
        rows.append([k, head, curves.effect[i], float(curves.random_mean[i]), float(curves.random_std[i])]
                    + [r[i] for r in curves.random])
    write_csv(out / "knockout_curves.csv", header, rows)
    plot_curves(curves, out / "knockout_curves.png",
                f"{model_name}: knocking out top-k heads (effect-rank vs random-rank, {seeds} seeds)")


def _format_curves(curves: KnockoutCurves) -> str:
    lines = ["   k  head    effect-rank  random-rank (mean ± std)"]
    for i, k in enumerate(curves.k):
        head = str(curves.effect_order[k - 1]) if k else "-"
        lines.append(f"{k:>4}  {head:<6}  {curves.effect_rank[i]:>10.1%}  {curves.random_mean[i]:>10.1%} ± "
                     f"{curves.random_std[i]:.1%}")
    return "\n".join(lines)


def transfer_sets(model: HookedModel, data: str, settings: KnockoutSettings, transfer_data: str | None,
                  data_dir: str | None, notes: Notes) -> list[tr.TransferSet]:
    """The transfer table's sets, in its order: the identification data itself (the reference row), one set per
    task or template of `transfer_data`, the generated sets, then SVAMP and GSM8K where `data_dir` has them; the
    generated and benchmark prompts as few-shot as the identification data's."""
    s = settings
    n = s.transfer_n
    ident = load_samples(model, data, s.limit, s.seed)
    sets = [tr.TransferSet(f"{Path(data).name} (identification data)", [x.prompt for x in ident],
                           [x.answer for x in ident], [x.answer_id for x in ident])]
    if transfer_data:
        sets += tr.from_pairs(model, transfer_data, by=s.transfer_by, n=n, seed=s.seed)
    shots = tr.data_shots(sets[0].prompts)
    sets += [tr.multidigit(model, n or 100, s.seed, shots), tr.decimal(model, n or 100, s.seed, shots),
             tr.year_span(model, n or 100, s.seed, shots)]
    folder = data_dir_from(data_dir)
    for name, prefer in (("svamp", "Danny has 12 bottle caps"), ("gsm8k", "")):
        try:
            sets.append(tr.benchmark(model, name, folder, n, s.seed, prefer, shots))
        except DataNotFound as err:
            notes.add(f"transfer to {name.upper()} skipped: {err}")
    return sets


def control_heads(model: HookedModel, key_heads: list[Head], seed: int) -> list[Head]:
    """The transfer control: as many heads as `key_heads`, drawn at random from the others."""
    others = [h for h in all_heads(model) if h not in set(key_heads)]
    return random_order(others, seed)[:len(key_heads)]


def _run_transfer(model, cfg: _Call, full, key_heads, notes: Notes, out: Path) -> Transfer | None:
    """The transfer table (the processes that do not write get None)."""
    s = cfg.settings
    sets = transfer_sets(model, cfg.data, s, cfg.transfer_data, cfg.data_dir, notes)
    ko = knockout_subset(full, key_heads)
    # the control's draws: seeds seed, seed + 1, ... (the first is the draw earlier releases made alone)
    draws = [control_heads(model, key_heads, s.seed + i) for i in range(s.transfer_draws)] if s.transfer_control \
        else []
    controls = [knockout_subset(full, d) for d in draws]
    # each set's row is kept as it finishes (one set per process at a time): at 7B a set takes an hour
    inputs = [(t.name, t.prompts, t.answer_ids) for t in sets]
    key = json.dumps([cfg.key_record(), model.name, key_heads, draws, inputs], sort_keys=True, default=str)
    done = resumable_map(lambda part: [tr.evaluate(model, t, ko, cfg.batch_size, cfg.progress, controls=controls)
                                       for t in part], sets, out / TRANSFER_PARTIAL,
                         hashlib.sha256(key.encode()).hexdigest(), world(),
                         encode=lambda rc: {"row": rc[0].to_json(), "case": rc[1].to_json()},
                         decode=lambda v: (TransferRow.from_json(v["row"]), Case.from_json(v["case"])))
    rows, cases = [r for r, _ in done], [c for _, c in done]
    for tset, row in zip(sets, rows):
        notes.add(f"{tset.name}: {row.fallback}" if row.fallback else "")
    if not is_main():
        return None
    table = tr.format_table(rows)
    case_text = "\n\n".join(c.text() for c in cases)
    write_csv(out / "transfer.csv", ["set", "n", "accuracy_before", "accuracy_after", "relative_change",
                                     "accuracy_random_heads", "relative_change_random_heads", "accuracy_random_draws",
                                     "note"],
              [[r.set, r.n, r.accuracy_before, r.accuracy_after, r.relative_change,
                "" if r.accuracy_random_heads is None else r.accuracy_random_heads, r.relative_change_random_heads,
                ";".join(map(str, r.accuracy_random_draws)), "; ".join(x for x in (r.note, r.fallback) if x)]
               for r in rows])
    header = f"knocked out: {','.join(map(str, key_heads))}" + "".join(
        f"\nrandom control, draw {i + 1}: {','.join(map(str, d))}" for i, d in enumerate(draws))
    atomic_write_text(out / "transfer_cases.txt", f"{header}\n\n{table}\n\n{case_text}\n")
    return Transfer(heads=key_heads, random_heads=draws[0] if draws else None, random_draws=draws, rows=rows,
                    cases=cases)

"""`keyheads knockout`: mean-ablation curves (effect-rank vs random-rank), the key heads' knockout and the
transfer table, written as JSON, CSV and PNG into the run folder."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic.dataclasses import dataclass as pydantic_dataclass
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..data.benchmarks import DataNotFound, data_dir_from
from ..distributed import is_main, map_sharded
from ..io import atomic_path, atomic_write_text, file_sha256, write_json
from ..knockout import Knockout, compute_means
from ..models.model import HookedModel
from ..models.prompt_set import PromptSet
from ..plotting import write_csv
from . import transfer as tr
from .common import (
    RUN_CONFIG,
    SUBSET,
    AnalysisError,
    alignment_warning,
    all_heads,
    fallback_note,
    knockout_subset,
    load_samples,
    read_pair_rows,
)
from .knockout_curves import CurveConfig, knockout_curves, plot_curves, random_order, set_accuracies
from .selection import Notes, Selection, choose_heads

MEANS_PARTIAL = "knockout_means.partial.safetensors"


@pydantic_dataclass(config=RUN_CONFIG)
class KnockoutRun:
    """Settings of `keyheads knockout`; the fields the `knockout:` section of a run config shares
    are composed from these (keyheads.config.sections). `n_samples` is `limit` in flags and YAML."""

    data: str = Field(description="pairs JSONL (reference, counterfactual, answer[, positions, operands])")
    out: str = Field(description="run folder for JSON, CSV and PNG files")
    selection: Selection = Field(default_factory=Selection, description="how the key heads are chosen")
    k: int = Field(default=20, ge=1, description="the curves knock out k = 0..K heads (capped at the head count)")
    seeds: int = Field(default=5, ge=1, description="random-rank orderings of the curves")
    seed: int = Field(
        default=0, ge=0, description="picks the subset, the random-rank orderings, the control heads and the "
        "transfer sets' prompts")
    n_samples: int | None = Field(default=300, ge=1, alias="limit", description=SUBSET)
    batch_size: int = Field(default=32, ge=1, description="prompts per forward pass")
    mean_mode: Literal["aligned", "global"] = Field(
        default="aligned", description="means per END-aligned position, or one "
        "mean over all positions")
    transfer: bool = Field(default=True, description="the transfer table")
    transfer_data: str | None = Field(default=None, description="another pairs file (other templates / tasks), one "
                                                                   "transfer set per value of its transfer_by field")
    transfer_by: Literal["task", "template"] = Field(default="task", description="one transfer row per task or per "
                                                                                 "template of transfer_data")
    data_dir: str | None = Field(default=None, description="benchmark folder with svamp/SVAMP.json and "
                                                              "gsm8k/test.jsonl (default $KEYHEADS_DATA)")
    transfer_n: int | None = Field(default=100, ge=1, description="prompts per generated / benchmark transfer set "
                                                                     "(None: all)")
    transfer_control: bool = Field(default=True, description="also knock out as many random non-key heads on every "
                                                             "transfer set (one more pass each)")
    progress: bool = Field(default=True, description="progress bars")


def run_knockout(model: HookedModel, cfg: KnockoutRun) -> dict:
    t0 = time.time()
    out = Path(cfg.out)
    notes = Notes()
    rows = read_pair_rows(cfg.data)
    cf: list[str] = [r.get("counterfactual") or "" for r in rows]
    if not all(cf):
        raise AnalysisError(f"{cfg.data}: knockout needs the counterfactual prompts (every line's 'counterfactual') "
                            "for the mean activations")
    notes.add(alignment_warning(model, cf) if cfg.mean_mode == "aligned" else "")
    key_heads, effects = choose_heads(model, cfg.selection)
    samples = load_samples(model, cfg.data, cfg.n_samples, cfg.seed)
    answers = [s.answer_id for s in samples]
    candidates = all_heads(model)
    if effects is None and cfg.k:
        notes.add("no --effects: the effect-rank / random-rank curves are skipped")
    k = min(cfg.k, len(candidates))
    if cfg.k > len(candidates):
        notes.add(f"--k {cfg.k} is more than the model's {len(candidates)} heads: capped at {k}")
    print(
        f"{model.name}: {len(samples)} reference prompts from {cfg.data}; means over {len(cf)} counterfactual prompts"
    )

    # one pass over the counterfactual prompts gives the means of every head
    full = _means(model, cf, candidates, cfg, out / MEANS_PARTIAL)
    prompts = PromptSet(model, [s.prompt for s in samples], cfg.batch_size)
    notes.add(fallback_note(full, prompts).text("reference prompts"))
    result: dict = {"model": model.name, "data": cfg.data, "n_samples": len(samples), "n_counterfactual": len(cf),
                    "mean_mode": cfg.mean_mode, "effects": cfg.selection.effects, "config": asdict(cfg)}

    if effects is not None and k:
        # the key heads' own knockout rides along with the curves' sets
        # everything the accuracies depend on: the settings, the data, the model and its ranking
        settings = {k: v for k, v in asdict(cfg).items() if k not in ("progress", "out")}
        key = json.dumps([settings, file_sha256(cfg.data), model.name, [h.to_json() for h in effects.ranked()]],
                         sort_keys=True, default=str)
        curves = knockout_curves(model, prompts, answers, full, effects.ranked(), candidates,
                                 CurveConfig(k=k, seeds=cfg.seeds, seed=cfg.seed), progress=cfg.progress,
                                 extra=[key_heads], checkpoint=(out / "knockout_curves.partial.json",
                                                                hashlib.sha256(key.encode()).hexdigest()))
        base, after = curves.effect[0], curves.extra[0]
        result["curves"] = {"k": curves.ks, "effect_rank": curves.effect, "random_rank": curves.random,
                            "random_mean": curves.random_mean.tolist(), "random_std": curves.random_std.tolist(),
                            "effect_order": [h.to_json() for h in curves.effect_order],
                            "random_orders": [[h.to_json() for h in o] for o in curves.random_orders]}
        if is_main():
            _write_curves(out, curves, model.name)
            print(_format_curves(curves))
    else:
        base, after = set_accuracies(model, prompts, answers, full, [[], key_heads])
    rel = (after - base) / base if base else float("nan")
    result["key_heads"] = {"heads": [h.to_json() for h in key_heads], "accuracy_before": base,
                           "accuracy_after": after, "relative_change": rel}
    print(f"knockout of {len(key_heads)} heads [{','.join(map(str, key_heads))}]: accuracy {base:.1%} -> {after:.1%} "
          + (f"({rel:+.1%} relative)" if base else "(none right before: no relative change)"))

    if cfg.transfer:
        result["transfer"] = _run_transfer(model, cfg, full, key_heads, notes, out)
    result["notes"] = list(notes)
    if not is_main():  # every process holds the whole result; one writes it
        return result
    write_json(out / "knockout.json", result)  # no timing inside: the same inputs give the same bytes
    for partial in ("knockout_curves.partial.json", MEANS_PARTIAL):
        (out / partial).unlink(missing_ok=True)
    print(f"wrote {out}/knockout.json" + (", knockout_curves.csv, knockout_curves.png" if "curves" in result else "")
          + (", transfer.csv, transfer_cases.txt" if cfg.transfer else "") + f" ({time.time() - t0:.0f} s)")
    return result


def _means(model: HookedModel, cf: list[str], heads, cfg: KnockoutRun, path: Path) -> Knockout:
    """Every head's mean output over the counterfactual prompts, kept beside the results until the stage
    ends: on a large model this pass is long, and an interrupted stage resumes after it."""
    key = hashlib.sha256(json.dumps([model.name, cf, cfg.batch_size, cfg.mean_mode]).encode()).hexdigest()
    try:
        with safe_open(str(path), "pt") as f:
            if (f.metadata() or {}).get("key") == key:
                return Knockout.from_state(heads, (), {name: f.get_tensor(name) for name in f.keys()},
                                           mode=cfg.mean_mode)
    except (OSError, SafetensorError, KeyError, ValueError):
        pass  # absent, truncated or of other settings: computed again
    full = compute_means(model, cf, heads=heads, batch_size=cfg.batch_size, mode=cfg.mean_mode,
                         progress=cfg.progress)
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


def _format_curves(curves) -> str:
    lines = ["   k  head    effect-rank  random-rank (mean ± std)"]
    for i, k in enumerate(curves.ks):
        head = str(curves.effect_order[k - 1]) if k else "-"
        lines.append(f"{k:>4}  {head:<6}  {curves.effect[i]:>10.1%}  {curves.random_mean[i]:>10.1%} ± "
                     f"{curves.random_std[i]:.1%}")
    return "\n".join(lines)


def _run_transfer(model, cfg: KnockoutRun, full, key_heads, notes: Notes, out: Path) -> dict:
    n = cfg.transfer_n
    # the identification data itself first, as the reference row
    ident = load_samples(model, cfg.data, cfg.n_samples, cfg.seed)
    sets = [tr.TransferSet(f"{Path(cfg.data).name} (identification data)", [s.prompt for s in ident],
                           [s.answer for s in ident], [s.answer_id for s in ident])]
    if cfg.transfer_data:
        sets += tr.from_pairs(model, cfg.transfer_data, by=cfg.transfer_by, n=n, seed=cfg.seed)
    sets += [tr.multidigit(model, n or 100, cfg.seed), tr.decimal(model, n or 100, cfg.seed),
             tr.year_span(model, n or 100, cfg.seed)]
    folder = data_dir_from(cfg.data_dir)
    for name, prefer in (("svamp", "Danny has 12 bottle caps"), ("gsm8k", "")):
        try:
            sets.append(tr.benchmark(model, name, folder, n, cfg.seed, prefer))
        except DataNotFound as err:
            notes.add(f"transfer to {name.upper()} skipped: {err}")
    ko = knockout_subset(full, key_heads)
    # control: as many heads, drawn at random from the others (seeded)
    others = [h for h in all_heads(model) if h not in set(key_heads)]
    control_heads = random_order(others, cfg.seed)[:len(key_heads)]
    control = knockout_subset(full, control_heads) if cfg.transfer_control else None
    done = map_sharded(lambda part: [tr.evaluate(model, t, ko, cfg.batch_size, cfg.progress, control=control)
                                     for t in part], sets)
    rows, cases = [r for r, _ in done], [c for _, c in done]
    for tset, row in zip(sets, rows):
        notes.add(f"{tset.name}: {row.fallback}" if row.fallback else "")
    if not is_main():
        return {}
    table = tr.format_table(rows)
    print(f"\ntransfer: knocking out {len(key_heads)} key heads [{','.join(map(str, key_heads))}]\n{table}\n")
    case_text = "\n\n".join(c.text() for c in cases)
    print(case_text)
    write_csv(out / "transfer.csv", ["set", "n", "accuracy_before", "accuracy_after", "relative_change",
                                     "accuracy_random_heads", "relative_change_random_heads", "note"],
              [[r.name, r.n, r.before, r.after, r.relative_drop, "" if r.control is None else r.control,
                r.control_drop, "; ".join(x for x in (r.note, r.fallback) if x)] for r in rows])
    header = f"knocked out: {','.join(map(str, key_heads))}" + (
        f"\nrandom control: {','.join(map(str, control_heads))}" if control else ""
    )
    atomic_write_text(out / "transfer_cases.txt", f"{header}\n\n{table}\n\n{case_text}\n")
    return {"heads": [h.to_json() for h in key_heads],
            "random_heads": [h.to_json() for h in control_heads] if control else None,
            "rows": [r.as_dict() for r in rows],
            "cases": [asdict(c) for c in cases]}

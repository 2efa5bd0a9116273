"""The three analysis runs behind `keyheads knockout`, `keyheads attention` and `keyheads mlp`.

Each run reads the model and files, computes, prints what the paper prints and writes JSON,
CSV and PNG files into its run folder (every file written atomically).
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from ..components import Components, Head
from ..distributed import is_main, map_sharded
from ..effects import Effects
from ..io import write_json
from ..knockout import compute_means
from ..models.model import HookedModel
from . import attention as att
from . import mlp as mlpmod
from . import transfer as tr
from .common import (
    AnalysisError,
    alignment_warning,
    all_heads,
    answer_token,
    fallback_note,
    knockout_subset,
    load_samples,
    read_pair_rows,
)
from .knockout_curves import CurveConfig, knockout_curves, plot_curves, random_order, set_accuracies
from .passes import PromptSet

# the runs' settings: unknown keys are errors; Python callers may use the field names, flags the aliases
RUN_CONFIG = ConfigDict(extra="forbid", populate_by_name=True)


class Notes(list):
    """Warnings and remarks: printed when they happen and kept for the run's JSON."""

    def add(self, text: str) -> None:
        if text:
            print(f"note: {text}", file=sys.stderr)
            self.append(text)


@dataclass
class Selection:
    """How key heads are chosen: explicit `heads` win; else `Components.select` over `effects` (an
    effects.json path) with `threshold` and `top_k` (neither: the paper's -5%)."""

    heads: tuple[Head, ...] = ()
    effects: str | None = None
    threshold: float | None = None
    top_k: int | None = None


def choose_heads(model: HookedModel, sel: Selection) -> tuple[list[Head], Effects | None]:
    """(key heads, Effects or None)."""
    effects = Effects.load(sel.effects, model) if sel.effects else None
    if sel.heads:
        return list(Components(tuple(sel.heads)).check(model.n_layers, model.n_heads).heads), effects
    if effects is None:
        raise AnalysisError("say which heads: --effects effects.json (from `keyheads patch`) or --heads L.H,...")
    return list(Components.select(effects, sel.threshold, sel.top_k, name=Path(sel.effects).name).heads), effects


# ---- knockout ------------------------------------------------------------------------------

SUBSET = "reference prompts used, a seeded subset (None: all)"


@pydantic_dataclass(config=RUN_CONFIG)
class KnockoutRun:
    """Settings of `keyheads knockout`; the fields the `knockout:` section of a run config shares
    are composed from these (keyheads.config.sections). `n_samples` is `limit` in flags and YAML."""

    data: str = Field(description="pairs JSONL (reference, counterfactual, answer[, positions, operands])")
    out: str = Field(description="run folder for JSON, CSV and PNG files")
    selection: Selection = Field(default_factory=Selection, description="how the key heads are chosen")
    k: int = Field(20, ge=1, description="the curves knock out k = 0..K heads (capped at the head count)")
    seeds: int = Field(5, ge=1, description="random-rank orderings of the curves")
    seed: int = Field(0, ge=0, description="picks the subset, the random-rank orderings, the control heads and the "
                                           "transfer sets' prompts")
    n_samples: int | None = Field(300, ge=1, alias="limit", description=SUBSET)
    batch_size: int = Field(32, ge=1, description="prompts per forward pass")
    mean_mode: Literal["aligned", "global"] = Field("aligned", description="means per END-aligned position, or one "
                                                                           "mean over all positions")
    transfer: bool = Field(True, description="the transfer table")
    transfer_data: str | None = Field(None, description="another pairs file (other templates / tasks), one "
                                                           "transfer set per value of its transfer_by field")
    transfer_by: Literal["task", "template"] = Field("task", description="one transfer row per task or per "
                                                                         "template of transfer_data")
    data_dir: str | None = Field(None, description="benchmark folder with svamp/SVAMP.json and "
                                                      "gsm8k/test.jsonl (default $KEYHEADS_DATA)")
    transfer_n: int | None = Field(100, ge=1, description="prompts per generated / benchmark transfer set "
                                                             "(None: all)")
    transfer_control: bool = Field(True, description="also knock out as many random non-key heads on every "
                                                     "transfer set (one more pass each)")
    progress: bool = Field(True, description="progress bars")


def run_knockout(model: HookedModel, cfg: KnockoutRun) -> dict:
    t0 = time.time()
    out = Path(cfg.out)
    notes = Notes()
    rows = read_pair_rows(cfg.data)
    cf = [r.get("counterfactual") for r in rows]
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
    print(f"{model.name}: {len(samples)} reference prompts from {cfg.data}; means over {len(cf)} counterfactual prompts")

    # one pass over the counterfactual prompts gives the means of every head
    full = compute_means(model, cf, heads=candidates, batch_size=cfg.batch_size, mode=cfg.mean_mode,
                         progress=cfg.progress)
    prompts = PromptSet(model, [s.prompt for s in samples], cfg.batch_size)
    notes.add(fallback_note(full, prompts).text("reference prompts"))
    result: dict = {"model": model.name, "data": cfg.data, "n_samples": len(samples), "n_counterfactual": len(cf),
                    "mean_mode": cfg.mean_mode, "effects": cfg.selection.effects, "config": asdict(cfg)}

    if effects is not None and k:
        # the key heads' own knockout rides along with the curves' sets
        curves = knockout_curves(model, prompts, answers, full, effects.ranked(), candidates,
                                 CurveConfig(k=k, seeds=cfg.seeds, seed=cfg.seed), progress=cfg.progress,
                                 extra=[key_heads])
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
    print(f"wrote {out}/knockout.json" + (", knockout_curves.csv, knockout_curves.png" if "curves" in result else "")
          + (", transfer.csv, transfer_cases.txt" if cfg.transfer else "") + f" ({time.time() - t0:.0f} s)")
    return result


def _write_curves(out: Path, curves, model_name: str) -> None:
    from ..plotting import write_csv

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
    from ..data.benchmarks import DataNotFound, data_dir_from
    from ..io import atomic_write_text
    from ..plotting import write_csv

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
    header = f"knocked out: {','.join(map(str, key_heads))}" + (f"\nrandom control: {','.join(map(str, control_heads))}" if control else "")
    atomic_write_text(out / "transfer_cases.txt", f"{header}\n\n{table}\n\n{case_text}\n")
    return {"heads": [h.to_json() for h in key_heads],
            "random_heads": [h.to_json() for h in control_heads] if control else None,
            "rows": [r.as_dict() for r in rows],
            "cases": [asdict(c) for c in cases]}


# ---- attention -----------------------------------------------------------------------------

@pydantic_dataclass(config=RUN_CONFIG)
class AttentionRun:
    """Settings of `keyheads attention`; `n_samples` is `limit` in flags and YAML."""

    data: str = Field(description="pairs JSONL with positions")
    out: str = Field(description="run folder")
    selection: Selection = Field(default_factory=Selection, description="how the key heads are chosen")
    n_samples: int | None = Field(1000, ge=1, alias="limit", description=SUBSET + "; the paper's 1000")
    seed: int = Field(0, ge=0, description="picks the subset")
    batch_size: int = Field(16, ge=1, description="prompts per forward pass")
    progress: bool = Field(True, description="progress bars")


def run_attention(model: HookedModel, cfg: AttentionRun) -> dict:
    from ..plotting import write_csv

    out = Path(cfg.out)
    notes = Notes()
    heads, effects = choose_heads(model, cfg.selection)
    samples = load_samples(model, cfg.data, cfg.n_samples, cfg.seed)
    missing = sum(1 for s in samples if not s.positions)
    if missing:
        raise AnalysisError(f"{cfg.data}: {missing} of {len(samples)} pairs have no 'positions' (token indices of A, "
                            "B and the operator); attention by token role needs them - regenerate the file with "
                            "`keyheads data`, which writes them")
    rows = att.end_attention(model, [s.prompt for s in samples], heads, cfg.batch_size, cfg.progress)
    roles = att.by_role(rows, samples)                                    # [n, heads, 5]
    tasks = sorted({s.task for s in samples})
    per_task = {t: roles[[i for i, s in enumerate(samples) if s.task == t]].mean(0) for t in tasks}
    counts = {t: sum(1 for s in samples if s.task == t) for t in tasks}
    labels = att.label_heads(heads, roles.mean(0))
    top_other = att.top_other_tokens(model, rows, samples)
    att.plot_by_role(per_task, counts, heads, labels, out / "attention_by_role.png")

    # figure 16-style: END rows on one prompt per task; figure 7: the figure-4 formats the heads never saw
    cases = [(f"{t} ({next(s.template for s in samples if s.task == t)})", next(s.prompt for s in samples
                                                                             if s.task == t)) for t in tasks]
    unseen = [(ts.name, ts.prompts[0]) for ts in (make(model, 1) for make in (tr.multidigit, tr.decimal, tr.year_span))]
    for group, name in ((cases, "attention_cases.png"), (unseen, "attention_transfer_cases.png")):
        group_rows = att.end_attention(model, [p for _, p in group], heads, progress=False)
        att.plot_cases(model, group, group_rows, heads, out / name)
    # figure 16: the full pattern of the strongest operator head and operand head
    drawn = []
    for kind in ("operator", "operand"):
        best = max((l for l in labels if l.label == kind), key=lambda l: getattr(l, kind), default=None)
        if best is None:
            continue
        task_cases = cases[:4]
        pats = att.full_patterns(model, [p for _, p in task_cases], best.head)
        name = f"attention_pattern_{best.head}.png"
        att.plot_patterns(model, task_cases, pats, best.head, kind, out / name)
        drawn.append(name)

    csv_rows = []
    for t in tasks + ["all"]:
        m = roles.mean(0) if t == "all" else per_task[t]
        for h, lab, vals in zip(heads, labels, m):
            csv_rows.append([t, str(h), lab.label, *[float(v) for v in vals]])
    write_csv(out / "attention_by_role.csv", ["task", "head", "label", *att.ROLES], csv_rows)
    result = {"model": model.name, "data": cfg.data, "n_samples": len(samples), "heads": [h.to_json() for h in heads],
              "roles": list(att.ROLES), "per_task": {t: per_task[t].tolist() for t in tasks}, "counts": counts,
              "all": roles.mean(0).tolist(),
              "labels": [{**l.as_dict(), "top_other_tokens": t} for l, t in zip(labels, top_other)],
              "effects": [{**h.to_json(), "effect": effects.effect(h)} for h in heads] if effects else None, "notes": list(notes)}
    write_json(out / "attention.json", result)
    print(f"{model.name}: END-token attention of {len(heads)} key heads over {len(samples)} reference prompts "
          f"({', '.join(f'{t}: {counts[t]}' for t in tasks)})")
    print(f"{'head':<7} {'label':<9} {'lean':<9} " + " ".join(f"{att.ROLE_NAMES[r]:>11}" for r in att.ROLES)
          + "  most-attended other tokens")
    for lab, vals, top in zip(labels, roles.mean(0), top_other):
        print(f"{str(lab.head):<7} {lab.label:<9} {lab.lean:<9} " + " ".join(f"{v:>11.3f}" for v in vals) + "  "
              + ", ".join(f"{t} {v:.2f}" for t, v in top))
    print(f"wrote {out}/attention.json, attention_by_role.csv, attention_by_role.png, attention_cases.png, "
          "attention_transfer_cases.png"
          + "".join(f", {d}" for d in drawn))
    return result


# ---- MLPs ----------------------------------------------------------------------------------

DEFAULT_CASE_PREFIX = "1 + 2 = 3\n4 + 4 = 8\n6 + 1 = 7\n"


@pydantic_dataclass(config=RUN_CONFIG)
class MLPRun:
    """Settings of `keyheads mlp`; `n_samples` is `limit` in flags and YAML."""

    data: str = Field(description="pairs JSONL with operands")
    out: str = Field(description="run folder")
    n_samples: int | None = Field(1000, ge=1, alias="limit", description=SUBSET)
    seed: int = Field(0, ge=0, description="picks the subset")
    batch_size: int = Field(16, ge=1, description="prompts per forward pass")
    case: str | None = Field(None, description="prompt of the layer-by-layer case (figure 6c; default: "
                                                  "'4 + 3 = ' after the data's own few-shot prefix)")
    case_answer: str = Field("7", description="the case's answer")
    progress: bool = Field(True, description="progress bars")


def case_prompt(samples) -> str:
    """'4 + 3 = ' with the few-shot prefix of the data's first 'A + B = ' prompt (the paper's case)."""
    for s in samples:
        if s.operands and "A" in s.operands and "B" in s.operands:
            tail = f"{s.operands['A']} + {s.operands['B']} ="
            stripped = s.prompt.rstrip()
            if stripped.endswith(tail):
                return stripped[: len(stripped) - len(tail)] + "4 + 3 = "
    return DEFAULT_CASE_PREFIX + "4 + 3 = "


def run_mlp(model: HookedModel, cfg: MLPRun) -> dict:
    from ..plotting import write_csv

    out = Path(cfg.out)
    samples = load_samples(model, cfg.data, cfg.n_samples, cfg.seed)
    curves = mlpmod.probe(model, samples, cfg.batch_size, cfg.progress)
    means = {k: v.mean(0) for k, v in curves.items()}
    operand, answer = mlpmod.contrasts(means)
    tp = mlpmod.turning_points(operand, answer)
    mlpmod.plot_curves(curves, tp, out / "mlp_input_operands.png", out / "mlp_output_answer.png", model.name)

    prompt = cfg.case or case_prompt(samples)
    prompt, _ = answer_token(model, prompt, cfg.case_answer)
    names, cos = mlpmod.case_numbers(model, prompt)
    tops = mlpmod.top_numbers(names, cos)
    mlpmod.plot_case(names, cos, prompt, cfg.case_answer, out / "mlp_case.png")

    L = model.n_layers
    write_csv(out / "mlp_curves.csv", ["layer", *[f"{k}_mean" for k in mlpmod.CURVES], *[f"{k}_std" for k in mlpmod.CURVES]],
              [[l, *[float(means[k][l]) for k in mlpmod.CURVES], *[float(curves[k][:, l].std()) for k in mlpmod.CURVES]]
               for l in range(L)])
    result = {"model": model.name, "data": cfg.data, "n_samples": len(samples), "read_point": mlpmod.mlp_read_point(model),
              "curves": {k: v.tolist() for k, v in means.items()},
              "operand_contrast": operand.tolist(), "answer_contrast": answer.tolist(),
              "turning_points": asdict(tp), "rule": mlpmod.RULE,
              "case": {"prompt": prompt, "answer": cfg.case_answer, "numbers": names, "top3_per_layer": tops,
                       "cosine": cos.tolist()}}
    write_json(out / "mlp.json", result)
    print(f"{model.name}: MLP probes at END over {len(samples)} reference prompts ({mlpmod.mlp_read_point(model)} as MLP_in)")
    print("layer  cos(in,A)  cos(in,B)  cos(in,other)  operand  cos(write,C)  cos(write,other)  answer  "
          "top numbers in the case's MLP write")
    for l in range(L):
        print(f"{l:>5}  {means['in_A'][l]:>9.3f}  {means['in_B'][l]:>9.3f}  {means['in_other'][l]:>13.3f}  "
              f"{operand[l]:>7.3f}  {means['write_C'][l]:>12.3f}  {means['write_other'][l]:>16.3f}  {answer[l]:>6.3f}  "
              f"{' '.join(tops[l])}")
    print(f"start-inflection-end: {tp.text()} (the operand contrast climbs from layer {tp.start} and peaks at "
          f"{tp.inflection}; the answer contrast peaks at {tp.end})")
    print(f"case {prompt.splitlines()[-1]!r} -> answer {cfg.case_answer}")
    print(f"wrote {out}/mlp.json, mlp_curves.csv, mlp_input_operands.png, mlp_output_answer.png, mlp_case.png")
    return result

"""Tables 1 and 2 of the paper and the math-gain vs generic-drift figure, from a finished run folder.

The run is `keyheads run configs/table1-<model>.yaml` (fine-tuning variants, then one evaluation of
all of them); this script only reads what it wrote, prints tables 1 and 2 as a markdown section and draws
studies/figures/table1-<model>.png. The repository's tables are rendered from committed records by
studies/pages.py, which reuses this script's tables.

    python -m studies.table1 runs/table1-smollm2
"""
from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from keyheads.evaluation.settings import display
from keyheads.plotting import new_figure, save_figure
from keyheads.report.rundata import (
    DRIFT,
    EvalRow,
    EvalTable,
    delta_band,
    eval_table,
    paired_family,
    seed_sets,
)
from keyheads.results.evaluation import BenchmarkSummary
from keyheads.results.finetune import FinetuneResult
from keyheads.results.run import SavedConfig
from keyheads.runfolder import RunFolder, read_result
from studies.study_results import show_section

FIGURES = Path(__file__).resolve().parent / "figures"


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def cell(t: EvalTable, row, bench: str) -> str:
    if bench == DRIFT:
        d = t.drift(row)
        if d is None or d.kl is None or d.kl_ci95 is None or d.perplexity is None:
            return "-"
        return f"{d.kl:.4f} [{d.kl_ci95[0]:.4f}-{d.kl_ci95[1]:.4f}], ppl {d.perplexity:.2f}"
    s = row.summary(bench)
    if s is None or row.acc(bench) is None:
        return "-"
    lo, hi = s.ci95 or [None, None]
    base = t.base.acc(bench) if t.base is not None and t.base is not row else None
    delta = f" ({100 * (row.acc(bench) - base):+.1f})" if base is not None else ""
    return f"{pct(row.acc(bench))} [{pct(lo)}-{pct(hi)}]{delta}"


def markdown_table(t: EvalTable, rows, runs: dict[str, FinetuneResult]) -> list[str]:
    benches = t.math() + t.generic() + ([DRIFT] if DRIFT in t.benchmarks else [])
    header = ["Variant", "Train speed (samples/s)", "Tuned params"] + [
        "Generic KL from base, perplexity" if b == DRIFT else f"{display(b)} % [95% CI] (Δ)" for b in benches]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        info = runs[r.run] if r.run in runs else None
        speed = info.train.samples_per_second if info is not None else None
        tuned = info.tuned_params if info is not None else None
        lines.append("| " + " | ".join([r.label, f"{speed:.2f}" if speed else "-", f"{tuned:,}" if tuned else "-"]
                                       + [cell(t, r, b) for b in benches]) + " |")
    return lines


def figure(t: EvalTable, out: Path) -> Path | None:
    rows = [r for r in t.rows if r.kind in ("model", "adapter")]
    # only the math sets every point has, so that the points average the same sets
    math = [b for b in t.math() if all(r.acc(b) is not None for r in rows)]
    points = [(r.label, t.mean_delta(r, math), t.drift(r)) for r in rows]
    points = [(label, gain, d) for label, gain, d in points
              if gain is not None and d is not None and d.kl is not None and d.kl_ci95 is not None]
    if not points:
        return None
    fig, ax = new_figure(6.5, 4.5)
    for label, gain, d in points:
        kl, (lo, hi) = d.kl, d.kl_ci95
        ax.errorbar(kl, 100 * gain, xerr=[[kl - lo], [hi - kl]], fmt="o")
        short = label.split(" + ", 1)[1] if " + " in label else "base"
        ax.annotate(short, (kl, 100 * gain), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.axhline(0, color="grey", lw=0.5)
    # drifts span two orders of magnitude (adapters ~0.01, full SFT ~0.3): linear near 0, log above
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_xlim(left=-0.001)
    ax.set_xlabel("generic drift: mean KL from the base model on MMLU/CSQA texts")
    ax.set_ylabel(f"math gain: mean accuracy change (points)\nover {', '.join(display(b) for b in math)}", fontsize=8)
    ax.set_title("Fine-tuning: math gain against generic drift")
    return save_figure(fig, out)


def paired_table(folder: RunFolder, t: EvalTable) -> tuple[list[str], int]:
    """Each row against the base row, item by item (keyheads.report.stats): +gained / -lost, the change in
    points with its 95% interval for paired proportions, the exact McNemar p and its Holm adjustment over
    every test of this table; then, for a control run with several seeds, the band of its Δ.
    -> (the table's lines, the number of tests in the family)."""
    benches = t.scored()
    base = t.base
    pairs = paired_family(folder, t)
    if base is None or not pairs:
        return [], 0
    lines = ["| Variant | " + " | ".join(display(b) for b in benches) + " |", "|" + "---|" * (len(benches) + 1)]
    others = [r for r in t.rows if r is not base]
    for r in others:
        tests = [pairs.get((r.label, b)) for b in benches]
        lines.append(f"| {r.label} | " + " | ".join(x.cell() if x else "-" for x in tests) + " |")
    for name, seeds in seed_sets(others):
        spreads = [delta_band(t, seeds, [b]) for b in benches]
        lines.append(f"| {name}: {len(seeds)} seeds, Δ | "
                     + " | ".join(s.text() if s else "-" for s in spreads) + " |")
    return lines, len(pairs)


def partial_table(run: Path, config: SavedConfig) -> tuple[EvalTable, list[tuple[str, str | None]]]:
    """The rows an interrupted eval stage finished, from the benchmarks' JSONs in its per-variant
    folders (a benchmark not reached stays empty). -> (table, (label, finetune run) of each row
    never evaluated)."""
    from keyheads.pipeline import eval_labels, key_heads

    variants = config.variants or []
    labels = eval_labels(str(config.model), len(key_heads(run).heads), variants, config.knockout_mean)
    kinds = ["model", "knockout"] + ["adapter"] * len(variants)
    names = [None, None] + list(variants)
    rows, missing = [], []
    for label, kind, name in zip(labels, kinds, names):
        folder = RunFolder(run).eval_variant(label)
        read = {b: read_result(folder / f"{b}.json", BenchmarkSummary.from_json) for b in config["eval"]["benchmarks"]}
        benchmarks = {b: s for b, s in read.items() if s is not None}
        if not benchmarks:
            missing.append((label, name))
            continue
        rows.append(EvalRow(label, kind, benchmarks, name))
    return EvalTable(list(config["eval"]["benchmarks"]), rows), missing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a finished `keyheads run configs/table1-*.yaml` folder")
    ap.add_argument("--partial", action="store_true",
                    help="the eval stage did not finish: table the rows it did finish, and name the others")
    args = ap.parse_args()
    run = Path(args.run)
    folder = RunFolder(run)
    saved = folder.config_record
    if saved is None:
        raise SystemExit(f"{run}/config.json not found: not a run folder")
    config = saved.to_json()
    runs, t, missing = folder.finetune_records, eval_table(folder), []
    if t is None and args.partial:
        t, missing = partial_table(run, saved)
    if t is None:
        raise SystemExit(f"{run}/eval/results.json not found: the eval stage has not finished (see --partial)")
    model = config["model"]
    precise = [r for r in t.rows if r.run in runs and runs[r.run].method == "precise"
               and not r.run.startswith("random")]
    # the paper's rows: base, full SFT, LoRA, precise SFT of the key heads; plus the knockout and the control
    # (precise@K with K the key heads' count is the same variant as precise)
    main_rows = ("full", "lora", "precise", f"precise@{config['identify']['top_k']}")
    table1 = [r for r in t.rows if r.kind in ("model", "knockout")
              or (r.run or "") in main_rows or (r.run or "").startswith("random")]
    png = figure(t, FIGURES / f"{run.name}.png")
    records = folder.stage_records
    trained_on = next((r.machine for k, r in records.items() if k.startswith("finetune/")), {})
    where = trained_on.get("gpu") or f"{trained_on.get('torch_threads', '?')} CPU threads"
    split = next((r.benchmarks[b].split for r in t.rows for b in ("addsub", "singleeq", "svamp")
                  if b in r.benchmarks), "not evaluated")
    ft = config["finetune"]
    n_train = next((info.data.n for info in runs.values()), "?")
    lines = [f"- date: {datetime.date.today().isoformat()}; commands: `keyheads run configs/{run.name}.yaml` (with "
             f"the flags its header gives; the effective settings are in {run.name}/config.json), then "
             f"`python -m studies.table1 {run}{' --partial' if missing else ''}`",
             f"- training data `{ft['train']}` ({n_train} examples), {ft['epochs']} epoch(s), lr "
             f"{ft['lr']}, batch {ft['optimizer_batch_size']}, optimizer {ft.get('optimizer') or 'adamw'}, "
             f"{config.get('dtype') or 'default dtype'}; "
             f"trained on {where} (train speed is measured there, each variant in this run); "
             f"{config['eval']['limit'] or 'all'} items per benchmark (AddSub/SingleEq/SVAMP split: {split}); "
             f"key heads = top-{config['identify']['top_k']} by path patching"]
    if missing:
        lines.append("- **incomplete**: the eval stage stopped before these rows: " + "; ".join(
            f"{label} (trained: {_trained(runs[name] if name in runs else None)})" for label, name in missing))
    # which mean the knockout row used: its results say, else the run's config
    ko_mean = next((r.mean for r in table1 if r.mean), None) or saved.knockout_mean
    lines += ["", "**Table 1** (95% Wilson intervals; Δ in points from the base row"
              + (f"; the knockout row, keyheads' addition (the paper's table 1 has none), used the {ko_mean} mean"
                 if any(r.kind == "knockout" for r in table1) else "")
              + ")", ""]
    lines += markdown_table(t, table1, runs)
    lines += ["", "**Table 2**: precise SFT by what it tunes", ""] + markdown_table(t, precise, runs)
    pairs, family = paired_table(folder, t)
    if pairs:
        lines += ["", "**Item by item against the base row** (same items: items gained / lost; Δ: the change in "
                  "points with its 95% interval for paired proportions, Newcombe's method 10; two-sided exact "
                  "McNemar p, and in brackets the p adjusted by Holm's method over all "
                  f"{family} tests of this table: a change counts only when the Holm p is below 0.05)",
                  ""] + pairs
    if png:
        lines += ["", f"![math gain vs generic drift](figures/{png.name})"]
    text = "\n".join(lines)
    show_section(f"Tables 1 and 2: precise SFT vs full SFT, LoRA and random heads on {model} ({run.name})", text)


def _trained(info: FinetuneResult | None) -> str:
    if info is None:
        return "no"
    return (f"{info.tuned_params:,} params, {info.train.samples_per_second:.1f} samples/s, "
            f"final loss {info.train.final_loss:.3f}")


if __name__ == "__main__":
    main()

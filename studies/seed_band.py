"""A random control over several seeds, as a band: each seed's accuracy per set, the mean and range of its
change from the base row, and each measured seed item by item against the base (exact McNemar, Newcombe 95%
interval, Holm over every test of the table).

Each FOLDER is a `keyheads eval` output whose first row is the base model and whose last row is one seed
of the control (a knockout of random heads, or an adapter trained on random heads). Every seed is read from
its folder: a seed whose folder is gone is re-run, never typed in from a page.

    python -m studies.seed_band --title TITLE "seed 0=RUN/seed0" "seed 1=RUN/seed1" "seed 2=RUN/seed2"
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from keyheads.report.stats import band, fmt_p, paired_sets, with_holm
from keyheads.runfolder import variant_slug
from studies.paired_rows import eval_labels, summaries, wrong_ids
from studies.study_results import show_section

KL = "generic-kl"


def row_folders(eval_dir: Path) -> tuple[Path, Path]:
    """(base row's folder, the control's folder): the first and last rows of the evaluation."""
    labels = eval_labels(eval_dir)
    return eval_dir / variant_slug(labels[0]), eval_dir / variant_slug(labels[-1])


def measured(eval_dir: Path) -> tuple[dict[str, float], dict[str, float], dict]:
    """(base accuracies, control accuracies, paired tests) in points (KL as itself) for one seed's folder."""
    base_dir, row_dir = row_folders(eval_dir)
    base, row, tests = {}, {}, {}
    base_summaries = summaries(base_dir)
    for name, summary in summaries(row_dir).items():
        if name == KL:
            row[KL] = _number(summary.kl, row_dir / f"{name}.json")
            continue
        base[name] = round(100 * _number(base_summaries[name].accuracy, base_dir / f"{name}.json"), 6)
        row[name] = round(100 * _number(summary.accuracy, row_dir / f"{name}.json"), 6)
        tests[name] = paired_sets(wrong_ids(base_dir, name), wrong_ids(row_dir, name), int(_number(summary.n, name)))
    return base, row, tests


def _number(value: float | None, where: object) -> float:
    if value is None:
        sys.exit(f"{where}: the value this table needs was not recorded")
    return value


def table(seeds: dict[str, dict[str, float]], base: dict[str, float], tests: dict[str, dict]) -> str:
    names = list(seeds)
    sets = [b for b in base]
    holm = with_holm({(s, b): t for s, by in tests.items() for b, t in by.items()})
    head = ["set", "base", *names, "change from base: mean [range]", *(f"{s} item by item" for s in tests)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in sets:
        values = [seeds[s].get(b) for s in names]
        spread = band([v - base[b] for v in values if v is not None])
        cells = [b, f"{base[b]:.0f}", *("-" if v is None else f"{v:.0f}" for v in values),
                 f"{spread.mean:+.1f} [{spread.low:+.0f}, {spread.high:+.0f}] ({spread.count} seeds)"]
        for s in tests:
            t = holm.get((s, b))
            cells.append("-" if t is None else f"+{t.gained} / -{t.lost}, Δ {100 * t.delta:+.1f} "
                         f"[{100 * t.ci[0]:+.1f}, {100 * t.ci[1]:+.1f}], p {fmt_p(t.p)} (Holm {fmt_p(t.p_holm)})")
        lines.append("| " + " | ".join(cells) + " |")
    kls = [seeds[s].get(KL) for s in names]
    if any(k is not None for k in kls):
        spread = band([k for k in kls if k is not None])
        lines.append("| " + " | ".join(["generic KL from base", "0", *("-" if k is None else f"{k:.3f}" for k in kls),
                                         f"{spread.mean:.3f} [{spread.low:.3f}, {spread.high:.3f}]",
                                         *("" for _ in tests)]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seeds", nargs="+", help="LABEL=EVAL_FOLDER, one per measured seed")
    ap.add_argument("--title", required=True, help="the section's title")
    ap.add_argument("--command", default="", help="the command that made the folders, for the section")
    args = ap.parse_args()

    seeds: dict[str, dict[str, float]] = {}
    tests: dict[str, dict] = {}
    base: dict[str, float] = {}
    for spec in args.seeds:
        label, _, folder = spec.partition("=")
        got_base, row, paired = measured(Path(folder))
        if base and got_base != base:
            sys.exit(f"{folder}: its base row differs from the other folders' ({got_base} vs {base})")
        base, seeds[label], tests[label] = got_base, row, paired
    body = table(dict(sorted(seeds.items())), base, tests)
    notes = ("Δ is the change in points with its 95% interval for paired proportions (Newcombe's method 10); Holm's "
             "correction is over every item-by-item test of this table.")
    text = "\n\n".join(x for x in (args.command and f"Command: {args.command}", body, notes) if x)
    show_section(args.title, text)


if __name__ == "__main__":
    main()

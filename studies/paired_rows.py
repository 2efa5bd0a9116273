"""Each row of an eval folder against its first row, item by item: for every benchmark the items gained and
lost, the change with its 95% Newcombe interval, and McNemar's p, Holm-adjusted over the row's benchmarks.

    python -m studies.paired_rows RUN/eval/full       # prints a markdown table
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from keyheads.report.stats import fmt_p, paired_sets, with_holm
from keyheads.results.evaluation import BenchmarkSummary, EvalResults
from keyheads.runfolder import RESULTS_JSON, read_result, variant_slug


def wrong_ids(folder: Path, benchmark: str) -> set[str]:
    path = folder / f"{benchmark}.wrong.jsonl"
    return {json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()}


def eval_labels(eval_dir: Path) -> list[str]:
    """The rows of a `keyheads eval` folder (its results.json, read as its type), in order."""
    table = read_result(eval_dir / RESULTS_JSON, EvalResults.from_json)
    if table is None:
        sys.exit(f"{eval_dir / RESULTS_JSON} not found: is {eval_dir} a finished `keyheads eval` folder?")
    return [v.label for v in table.variants]


def summaries(row_dir: Path) -> dict[str, BenchmarkSummary]:
    """{benchmark: its summary} of one row's folder (its BENCHMARK.json files, read as their type)."""
    found = {path.stem: read_result(path, BenchmarkSummary.from_json)
             for path in sorted(row_dir.glob("*.json")) if path.name != "summary.json"}
    return {name: s for name, s in found.items() if s is not None}


def compare(eval_dir: Path) -> str:
    rows = eval_labels(eval_dir)
    folders = [eval_dir / variant_slug(label) for label in rows]
    first = folders[0]
    lines = ["| row | benchmark | n | gained | lost | change [95% CI] | McNemar p | Holm p |",
             "|---|---|---|---|---|---|---|---|"]
    for label, folder in zip(rows[1:], folders[1:]):
        tests = {}
        for name, summary in summaries(folder).items():
            if summary.correct is None or summary.n is None:
                continue  # drift measures have no items right or wrong
            tests[name] = paired_sets(wrong_ids(first, name), wrong_ids(folder, name), summary.n)
        for name, t in with_holm(tests).items():
            lines.append(f"| {label} | {name} | {t.n} | {t.gained} | {t.lost} | {100 * t.delta:+.1f} "
                         f"[{100 * t.ci[0]:+.1f}, {100 * t.ci[1]:+.1f}] | {fmt_p(t.p)} | {fmt_p(t.p_holm)} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m studies.paired_rows EVAL_FOLDER")
    print(compare(Path(sys.argv[1])))


if __name__ == "__main__":
    main()

"""Each row of an eval folder against its first row, item by item: for every benchmark the items gained and
lost, the change with its 95% Newcombe interval, and McNemar's p, Holm-adjusted over the row's benchmarks.

    python studies/paired_rows.py RUN/eval/full       # prints a markdown table
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from keyheads.report.stats import fmt_p, paired_sets, with_holm  # noqa: E402
from keyheads.runfolder import variant_slug  # noqa: E402


def wrong_ids(folder: Path, benchmark: str) -> set[str]:
    path = folder / f"{benchmark}.wrong.jsonl"
    return {json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()}


def compare(eval_dir: Path) -> str:
    results = json.loads((eval_dir / "results.json").read_text())
    rows = [v["label"] for v in results["variants"]]
    folders = [eval_dir / variant_slug(label) for label in rows]
    first = folders[0]
    lines = ["| row | benchmark | n | gained | lost | change [95% CI] | McNemar p | Holm p |",
             "|---|---|---|---|---|---|---|---|"]
    for label, folder in zip(rows[1:], folders[1:]):
        tests = {}
        for result in sorted(folder.glob("*.json")):
            summary = json.loads(result.read_text())
            if "correct" not in summary or result.name == "summary.json":
                continue  # drift measures have no items right or wrong
            name = result.stem
            tests[name] = paired_sets(wrong_ids(first, name), wrong_ids(folder, name), summary["n"])
        for name, t in with_holm(tests).items():
            lines.append(f"| {label} | {name} | {t.n} | {t.gained} | {t.lost} | {100 * t.delta:+.1f} "
                         f"[{100 * t.ci[0]:+.1f}, {100 * t.ci[1]:+.1f}] | {fmt_p(t.p)} | {fmt_p(t.p_holm)} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python studies/paired_rows.py EVAL_FOLDER")
    print(compare(Path(sys.argv[1])))


if __name__ == "__main__":
    main()

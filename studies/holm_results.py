"""Rewrite the item-by-item cells of studies/RESULTS.md: the change in points with its 95% interval, and the
McNemar p with Holm's correction over each table's family, from the counts the cells already give.

    python studies/holm_results.py [--check] [FILE]

Two kinds of table list item-by-item results:
- the `Item by item against the base row` tables of studies/table1.py: each row against the base row,
  "+gained / -lost (p ...)"; the base row's accuracy (for the paired interval) is the `(base)` row of the
  same section's Table 1, and n the section's "N items per benchmark";
- the knockout control table (`| set | base | 10 key heads out | 10 random heads out | key against random`):
  the random knockout against the base row ("+a/-b"), and the key-head knockout against the random one
  ("a against b": items right only with the key heads out, then only with the random ones); n is the
  `--limit` of the command above it.

Each cell becomes keyheads.report.stats.PairedTest.cell() (`+6 / -0, Δ +12.0 [+3.0, +20.4], p 0.031
(Holm 1)`), Holm's correction runs over every test of its table, and one sentence under the table says
so. Every count is checked against the accuracies the tables print. The rewritten cells are read back as
well as the old ones, so a second run changes nothing (--check fails when a run would change the file).
"""
from __future__ import annotations

import argparse
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from keyheads.report.stats import PairedTest, paired_test, with_holm

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
NOTE = "Holm's correction was applied"  # how the sentence under a rewritten table begins
COUNTS = re.compile(r"\+(\d+) ?/ ?-(\d+)")
OLD_P = re.compile(r"\bp ([0-9.e-]+)")
WIDTH = 110  # the prose of RESULTS.md is wrapped about here


@dataclass
class Cell:
    line: int                # index in the file's lines
    column: int              # index among the row's cells
    gained: int
    lost: int
    n: int
    reference_right: int
    old_p: str | None        # the p an old-format cell printed, to check the recount against
    wrap: tuple[str, str]    # what stays around the test: bold markers, a leading accuracy
    where: str = ""          # row and column, for the printout

    def test(self) -> PairedTest:
        return paired_test(self.gained, self.lost, self.n, self.reference_right)


def cells_of(line: str) -> tuple[str, list[str]]:
    """'    | a | b |' -> ('    ', ['a', 'b'])."""
    indent = line[: len(line) - len(line.lstrip())]
    return indent, [c.strip() for c in line.strip().strip("|").split("|")]


def row_line(indent: str, cells: list[str]) -> str:
    return indent + "| " + " | ".join(cells) + " |"


def table_end(lines: list[str], start: int) -> int:
    """The index after the last row of the table whose header is at `start`."""
    end = start
    while end < len(lines) and lines[end].strip().startswith("|"):
        end += 1
    return end


def right_of(percent: str, n: int) -> int:
    """'60.0 [46.2-72.4] (+1.0)' or '60' -> items right of n."""
    value = float(re.match(r"\s*\**([0-9.]+)", percent).group(1))  # type: ignore[union-attr]
    right = round(value * n / 100)
    if abs(100 * right / n - value) > 0.051:
        raise SystemExit(f"{percent!r} is not a whole number of {n} items")
    return right


def check_p(cell: Cell, p: float) -> None:
    """An old cell's printed p must be the recount's, to the digits it printed."""
    if cell.old_p is None:
        return
    digits = len(re.sub(r"e.*|^0\.0*|\.", "", cell.old_p)) or 1
    if f"{p:.{digits}g}" != f"{float(cell.old_p):.{digits}g}":
        raise SystemExit(f"line {cell.line + 1}: printed p {cell.old_p}, recount {p:.3g}")


# ---- tables of studies/table1.py ----------------------------------------------------------------------
def section_bounds(lines: list[str], at: int) -> tuple[int, int]:
    start = max(i for i in range(at + 1) if lines[i].startswith("## "))
    end = next((i for i in range(at + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return start, end


def accuracy_rows(lines: list[str], start: int, end: int) -> tuple[dict[str, int], dict[str, list[str]]]:
    """The accuracy tables (Table 1 and 2) of a section: {benchmark display name: column}, {label: cells}."""
    columns: dict[str, int] = {}
    rows: dict[str, list[str]] = {}
    for i in range(start, end):
        if lines[i].startswith("| Variant | Train speed"):
            _, header = cells_of(lines[i])
            columns = {h.split(" % ")[0]: j for j, h in enumerate(header) if " % " in h}
            for k in range(i + 2, table_end(lines, i)):
                _, cells = cells_of(lines[k])
                rows[cells[0]] = cells
    return columns, rows


def table1_cells(lines: list[str], header: int) -> list[Cell]:
    start, end = section_bounds(lines, header)
    found = re.search(r"(\d+) items per benchmark", "\n".join(lines[start:end]))
    if not found:
        raise SystemExit(f"line {header + 1}: no 'N items per benchmark' in its section")
    n = int(found.group(1))
    columns, accuracy = accuracy_rows(lines, start, end)
    base = next(cells for label, cells in accuracy.items() if label.endswith("(base)"))
    _, names = cells_of(lines[header])
    out = []
    for i in range(header + 2, table_end(lines, header)):
        _, cells = cells_of(lines[i])
        for j, text in enumerate(cells[1:], start=1):
            counts = COUNTS.match(text)
            if not counts:
                continue
            reference = right_of(base[columns[names[j]]], n)
            old = OLD_P.search(text) if "Holm" not in text else None
            cell = Cell(i, j, int(counts.group(1)), int(counts.group(2)), n, reference,
                        old.group(1) if old else None, ("", ""), f"{cells[0]}, {names[j]}")
            if cells[0] in accuracy:  # the row's own accuracy must be the base's plus the change
                row_right = right_of(accuracy[cells[0]][columns[names[j]]], n)
                if row_right != reference + cell.gained - cell.lost:
                    raise SystemExit(f"line {i + 1}, {names[j]}: {text} does not match the accuracies")
            out.append(cell)
    return out


# ---- the knockout control table ----------------------------------------------------------------------
KEY_AGAINST = re.compile(r"^(\d+) (?:right only with the key heads out, |against )(\d+)")


def control_cells(lines: list[str], header: int) -> list[Cell]:
    """Column 3: random heads out against the base row; column 4: key heads out against random heads out."""
    found = [re.search(r"--limit (\d+)", lines[i]) for i in range(header - 1, -1, -1)]
    limit = next((f for f in found if f), None)
    if limit is None:
        raise SystemExit(f"line {header + 1}: no --limit above the table")
    n = int(limit.group(1))
    out = []
    for i in range(header + 2, table_end(lines, header)):
        _, cells = cells_of(lines[i])
        random_cell, key_cell = cells[3], cells[4]
        bold = ("**", "**") if random_cell.startswith("**") else ("", "")
        inner = random_cell.strip("*")
        counts = COUNTS.search(inner)
        if not counts:  # a row without item-by-item results (the KL row)
            continue
        base_right, key_right = right_of(cells[1], n), right_of(cells[2], n)
        random_right = right_of(inner, n)
        old = OLD_P.search(inner) if "Holm" not in inner else None
        lead = inner.split(" (", 1)[0]
        rnd = Cell(i, 3, int(counts.group(1)), int(counts.group(2)), n, base_right, old.group(1) if old else None,
                   (bold[0] + lead + " (", ")" + bold[1]), f"{cells[0]}, random heads against base")
        if random_right != base_right + rnd.gained - rnd.lost:
            raise SystemExit(f"line {i + 1}: {random_cell} does not match the accuracies")
        kbold = ("**", "**") if key_cell.startswith("**") else ("", "")
        kinner = key_cell.strip("*")
        kcounts = COUNTS.match(kinner) or KEY_AGAINST.match(kinner)
        if not kcounts:
            raise SystemExit(f"line {i + 1}: {key_cell!r} is not an item-by-item result")
        old = OLD_P.search(kinner) if "Holm" not in kinner else None
        key = Cell(i, 4, int(kcounts.group(1)), int(kcounts.group(2)), n, random_right,
                   old.group(1) if old else None, kbold, f"{cells[0]}, key heads against random heads")
        if key_right != random_right + key.gained - key.lost:
            raise SystemExit(f"line {i + 1}: {key_cell} does not match the accuracies")
        out += [rnd, key]
    return out


def sentence(family: int, what: str) -> str:
    return (f"{NOTE} over the family of all {family} item-by-item tests in this table (the p in brackets){what}; "
            "Δ is the change in points with its 95% interval for paired proportions (Newcombe's method 10), and a "
            "change counts as more than noise only when its Holm p is below 0.05.")


def rewrite(text: str) -> tuple[str, list[tuple[str, list[tuple[Cell, PairedTest]]]]]:
    """-> (the new text, [(table, [(cell, its test)])])."""
    lines = text.split("\n")
    tables = []
    for i, line in enumerate(lines):
        head = line.strip()
        if head.startswith("| Variant |") and i >= 2 and lines[i - 2].startswith("**Item by item against the base"):
            tables.append((i, table1_cells(lines, i), ""))
        elif head.startswith("| set | base |") and "key against random" in head:
            tables.append((i, control_cells(lines, i), ": the random heads against the base row, and the key "
                           "heads against the random ones"))
    report = []
    for header, cells, what in reversed(tables):  # from the end, so that inserted lines move nothing above
        tests = with_holm({k: c.test() for k, c in enumerate(cells)})
        for k, c in enumerate(cells):
            check_p(c, tests[k].p)
            indent, row = cells_of(lines[c.line])
            row[c.column] = c.wrap[0] + tests[k].cell() + c.wrap[1]
            lines[c.line] = row_line(indent, row)
        end = table_end(lines, header)
        indent, _ = cells_of(lines[header])
        note = textwrap.wrap(sentence(len(cells), what), WIDTH, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)
        if end + 1 < len(lines) and lines[end].strip() == "" and lines[end + 1].strip().startswith(NOTE):
            last = next((k for k in range(end + 1, len(lines)) if not lines[k].strip()), len(lines))
            lines[end + 1:last] = note  # the sentence of an earlier run
        else:
            lines[end:end] = ["", *note]
        title = lines[section_bounds(lines, header)[0]]
        report.append((f"{title} (line {header + 1})", [(c, tests[k]) for k, c in enumerate(cells)]))
    return "\n".join(lines), list(reversed(report))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default=str(RESULTS))
    ap.add_argument("--check", action="store_true", help="change nothing; fail if a run would change the file")
    args = ap.parse_args()
    path = Path(args.file)
    old = path.read_text(encoding="utf-8")
    new, report = rewrite(old)
    for title, tests in report:
        print(f"{title}: {len(tests)} tests")
        for c, t in tests:
            if t.p < 0.05:
                verdict = "significant after Holm" if t.significant else "NOT significant after Holm"
                print(f"  {c.where}: {t.cell()} ({verdict})")
    if args.check:
        sys.exit(0 if new == old else 1)
    if new != old:
        path.write_text(new, encoding="utf-8")


if __name__ == "__main__":
    main()

"""The findings table, computed from committed study records: one row per claim, one column per model.

Each model's cells are the verdicts of `keyheads.report.findings` (the one place a verdict is decided) on the
run folder its study's record holds, with the rule's key numbers; the paper's column quotes the paper. The
columns and the studies are listed in studies/studies.json. `python -m studies.pages` writes the table, between
its markers, into README.md and studies/RESULTS.md; tests/test_findings_table.py checks that both say what the
records give.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from keyheads.report.findings import Finding, findings
from keyheads.report.rules import RULES, RULES_VERSION
from keyheads.study.cells import is_cells, merge

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "studies" / "studies.json"
# The markers name the script's file, as the committed pages carry them (tests/test_one_value.py checks it exists).
BEGIN = "<!-- findings table: written by `python studies/pages.py` from the records in studies/studies.json -->"
END = "<!-- end of findings table -->"
RULES_BEGIN = "<!-- verdict rules: written by `python studies/pages.py` from keyheads/report/rules.py -->"
RULES_END = "<!-- end of verdict rules -->"
CHANGES_BEGIN = "<!-- verdict changes: written by `python studies/pages.py` from studies/verdict_changes.json -->"
CHANGES_END = "<!-- end of verdict changes -->"
CHANGES = ROOT / "studies" / "verdict_changes.json"


def key_numbers(finding: Finding) -> str:
    """What a cell says after its verdict: the rule's key numbers, or for a claim not measured, why not."""
    return finding.key or (finding.evidence if finding.verdict == "not measured" else "")


def verdict(finding: Finding) -> str:
    """The verdict as a cell shows it, with the version of the rules it was judged under: '**holds** (v2)'."""
    return f"**{finding.verdict}** (v{finding.version})"


def cell(finding: Finding) -> str:
    key = key_numbers(finding)
    return f"{verdict(finding)}: {key}" if key else verdict(finding)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rules_block() -> str:
    """The rules table: per row, the claim, whether it is a measurement or descriptive, its test or threshold and
    family, and what each verdict requires."""
    lines = [RULES_BEGIN, f"Rules version {RULES_VERSION}. A blank cell: the rule never gives that verdict.", "",
             "| # | Claim | Kind | Test or threshold | Family | holds | partly | does not hold | not testable | "
             "not measured |", "|" + "---|" * 10]
    for r in RULES:
        cells = [r.claim, r.kind, r.test, r.family, r.holds, r.partly, r.does_not_hold, r.not_testable,
                 r.not_measured]
        lines.append(f"| {r.row} | " + " | ".join(_md(c) or " " for c in cells) + " |")
    lines.append(RULES_END)
    return "\n".join(lines)


def changes_block(path: Path = CHANGES) -> str:
    """The change log: each rules version, and every verdict of a committed record that moved with it, and why."""
    log = json.loads(path.read_text())["changes"] if path.is_file() else []
    lines = [CHANGES_BEGIN]
    for entry in reversed(log):
        lines += [f"Rules v{entry['from_version']} to v{entry['rules_version']}: {len(entry['moved'])} verdicts "
                  "moved.", ""]
        if entry["moved"]:
            lines += ["| study | # | from | to | why the rule changed |", "|---|---|---|---|---|"]
            lines += [f"| {m['study']} | {m['row']} | {m['from']} | {m['to']} | {_md(m['why'])} |"
                      for m in entry["moved"]]
        lines.append("")
    rules = [f"- Row {r.row}, v{v}: {c}" for r in RULES for v, c in sorted(r.changes.items())]
    lines += ["Each rule's changes, with the golden cases (tests/report/test_verdict_rules.py) that motivate them:",
              "", *rules, CHANGES_END]
    return "\n".join(lines)


def study(manifest: dict, name: str) -> dict:
    """The study called `name` in the manifest (a KeyError naming it if there is none)."""
    found = [s for s in manifest["studies"] if s["name"] == name]
    if len(found) != 1:
        raise KeyError(f"studies/studies.json: {len(found)} studies named {name!r}, expected one")
    return found[0]


MERGED = Path(tempfile.gettempdir()) / f"keyheads-merged-cells-{os.getpid()}"


def run_of(record: Path) -> Path:
    """The run folder a record holds: its run/, or for a study kept as cells (keyheads study), every cell record
    merged into one (a scratch folder, rewritten on each call)."""
    if is_cells(record):
        return merge(record, MERGED / record.as_posix().strip("/").replace("/", "--")).root
    return record / "run"


def column(record: str | None, root: Path = ROOT) -> dict[str, str]:
    """row -> cell of one model: its record's verdicts, or nothing while the record is pending."""
    if record is None:
        return {}
    return {str(f.row): cell(f) for f in findings(run_of(root / record))}


def table(manifest: dict, root: Path = ROOT) -> str:
    models = manifest["models"]
    studies = [study(manifest, m["study"]) for m in models]
    columns = [column(s["record"], root) for s in studies]
    head = ["#", "Claim", manifest["paper"]["name"], *(m["name"] for m in models)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, claim in manifest["rows"].items():
        cells = [c.get(row) or f"**not measured**: record pending (`{s['config']}`)" for c, s in zip(columns, studies)]
        lines.append(f"| {row} | {claim} | {manifest['paper']['cells'][row]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def block(manifest: dict, root: Path = ROOT) -> str:
    return f"{BEGIN}\n{table(manifest, root)}\n{END}"


def written(text: str) -> str | None:
    """The findings block a page holds, markers included (None without one)."""
    start, end = text.find(BEGIN), text.find(END)
    return text[start:end + len(END)] if start >= 0 and end > start else None


def load_manifest(path: Path = MANIFEST) -> dict:
    return json.loads(path.read_text())

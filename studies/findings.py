"""The findings table, computed from committed study records: one row per claim, one column per model.

Each model's cells are the verdicts of `keyheads.report.findings` (the one place a verdict is decided) on the
run folder its record holds, with the rule's key numbers; the paper's column quotes the paper. The columns are
listed in studies/findings.json. The table is written, between its markers, into README.md and
studies/RESULTS.md; tests/test_findings_table.py checks that both say what the records give.

    python studies/findings.py           # write the table into README.md and studies/RESULTS.md
    python studies/findings.py --check   # exit 1 when either differs from what the records give
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from keyheads.report.findings import Finding, findings

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "studies" / "findings.json"
PAGES = [ROOT / "README.md", ROOT / "studies" / "RESULTS.md"]
BEGIN = "<!-- findings table: written by `python studies/findings.py` from the records in studies/findings.json -->"
END = "<!-- end of findings table -->"


def cell(finding: Finding) -> str:
    return f"**{finding.verdict}**: {finding.key}" if finding.key else f"**{finding.verdict}**"


def column(model: dict, root: Path = ROOT) -> dict[str, str]:
    """row -> cell of one model: its record's verdicts, or 'not measured' while the record is pending."""
    if model.get("record") is None:
        return {}
    return {str(f.row): cell(f) for f in findings(root / model["record"])}


def table(manifest: dict, root: Path = ROOT) -> str:
    models = manifest["models"]
    columns = [column(m, root) for m in models]
    head = ["#", "Claim", manifest["paper"]["name"], *(m["name"] for m in models)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, claim in manifest["rows"].items():
        cells = [c.get(row) or f"**not measured**: record pending (`{m['config']}`)" for c, m in zip(columns, models)]
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    args = ap.parse_args(argv)
    want = block(load_manifest())
    stale = []
    for page in PAGES:
        text = page.read_text()
        have = written(text)
        if have is None:
            print(f"{page.relative_to(ROOT)}: no findings table markers ({BEGIN!r} ... {END!r})", file=sys.stderr)
            return 1
        if have != want:
            stale.append(page)
            if not args.check:
                page.write_text(text.replace(have, want))
    for page in stale:
        print(f"{page.relative_to(ROOT)}: " + ("differs from the records" if args.check else "table rewritten"))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Re-judge every committed study record under the current verdict rules, and log every verdict that moved.

studies/verdicts.json holds the verdict of every row on every record listed in studies/studies.json, with the
rules' version they were judged under. When a rule changes (keyheads.report.rules: RULES_VERSION raised, the change
said in the rule's `changes`), this script judges every record again, appends each verdict that moved to
studies/verdict_changes.json with the changed rule's reason, and rewrites verdicts.json. A verdict that moves under
the same rules version is refused: either the rules changed without a new version, or a record changed, which is
not a rule change (a new record path is judged afresh and logged as such).

    python -m studies.rejudge            # re-judge, log, rewrite
    python -m studies.rejudge --check    # exit 1 when verdicts.json is not what the rules give now
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from keyheads.io import file_sha256, write_json
from keyheads.report.findings import findings
from keyheads.report.rules import RULE, RULES_VERSION
from studies import findings as table

ROOT = table.ROOT
VERDICTS = ROOT / "studies" / "verdicts.json"
CHANGES = ROOT / "studies" / "verdict_changes.json"
ABOUT = ("The verdict of every row on every committed study record, as last judged: studies/rejudge.py writes it, "
         "and tests/test_verdict_log.py checks it equals what the rules give now.")
CHANGES_ABOUT = ("Every verdict of a committed record that moved when the rules changed, with the rule's reason: "
                 "studies/rejudge.py appends to it, studies/pages.py renders it in studies/RESULTS.md.")


def evidence(record: Path) -> str:
    """A digest of every file of a record: a study kept as cells gains cells without changing its path, and a
    verdict that moves with new evidence is no rule change."""
    h = hashlib.sha256()
    for path in sorted(p for p in record.rglob("*") if p.is_file()):
        h.update(f"{path.relative_to(record).as_posix()}\0{file_sha256(path)}\n".encode())
    return h.hexdigest()


def judged(manifest: dict, root: Path = ROOT) -> dict:
    """{study: {record, evidence, verdicts: {row: verdict}}} of every study with a committed record, under the
    rules now."""
    return {s["name"]: {"record": s["record"], "evidence": evidence(root / s["record"]),
                        "verdicts": {str(f.row): f.verdict for f in findings(table.run_of(root / s["record"]))}}
            for s in manifest["studies"] if s["record"] is not None}


def moved(before: dict, now: dict) -> list[dict]:
    """The verdicts that differ between two snapshots, on the records both judged."""
    out = []
    for name, study in now.items():
        old = before.get(name)
        if old is None or old["record"] != study["record"] or old.get("evidence") != study["evidence"]:
            continue  # a new record, or new evidence in it: judged afresh, not a rule's move
        out += [{"study": name, "row": int(row), "from": old["verdicts"].get(row, "not measured"), "to": verdict}
                for row, verdict in study["verdicts"].items() if old["verdicts"].get(row) != verdict]
    return out


def load(path: Path, default: dict) -> dict:
    return json.loads(path.read_text()) if path.is_file() else default


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--check", action="store_true", help="only check that verdicts.json is current")
    check = args.parse_args(argv).check
    before = load(VERDICTS, {"rules_version": 0, "studies": {}})
    now = judged(table.load_manifest())
    changes = moved(before["studies"], now)
    current = before["rules_version"] == RULES_VERSION and before["studies"] == now
    if check:
        if not current:
            print(f"{VERDICTS.name} is not what rules v{RULES_VERSION} give: run python -m studies.rejudge",
                  file=sys.stderr)
        return 0 if current else 1
    if changes and before["rules_version"] == RULES_VERSION:
        print(f"verdicts moved under the same rules version v{RULES_VERSION}:\n"
              + "\n".join(f"  {c['study']} row {c['row']}: {c['from']} -> {c['to']}" for c in changes)
              + "\nRaise RULES_VERSION in keyheads/report/rules.py and say why in each changed rule's `changes`.",
              file=sys.stderr)
        return 1
    if before["rules_version"] != RULES_VERSION:
        log = load(CHANGES, {"about": CHANGES_ABOUT, "changes": []})
        for c in changes:
            c["why"] = RULE[c["row"]].changes.get(RULES_VERSION, "this rule did not change: a rule it reads did")
        log["changes"] = [e for e in log["changes"] if e["rules_version"] != RULES_VERSION]
        log["changes"].append({"rules_version": RULES_VERSION, "from_version": before["rules_version"],
                               "moved": changes})
        write_json(CHANGES, log)
    write_json(VERDICTS, {"about": ABOUT, "rules_version": RULES_VERSION, "studies": now})
    print(f"{len(now)} records judged under rules v{RULES_VERSION}; {len(changes)} verdicts moved")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The findings table is computed, not written: README.md and studies/RESULTS.md carry exactly what
studies/findings.py computes from the committed records (`python -m studies.pages` writes it there); a changed
number in a record changes its cell; each cell names the rules version it was judged under and says what
studies/verdicts.json logged. Whether a rule gives the right verdict is tests/report/test_verdict_rules.py's, on
golden cases, not on the records. That no verdict, p-value or accuracy is stated twice is
tests/test_one_value.py's."""
import json
from pathlib import Path

from keyheads.report.findings import findings
from keyheads.report.rules import RULES_VERSION
from studies import findings as study_findings

from .report.handmade import make_run

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "studies" / "RESULTS.md"]


def cells(table: str) -> dict[tuple[str, str], str]:
    """(row, column name) -> cell, from a markdown table."""
    lines = [line for line in table.splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    out = {}
    for line in lines[2:]:
        row = [c.strip() for c in line.strip("|").split(" | ")]
        out |= {(row[0], name): value for name, value in zip(head[2:], row[2:])}
    return out


def test_readme_and_results_carry_the_table_the_records_give():
    want = study_findings.block(study_findings.load_manifest())
    for page in PAGES:
        assert study_findings.written(page.read_text()) == want, f"{page.name}: run python -m studies.pages"
    manifest = study_findings.load_manifest()
    assert list(manifest["rows"]) == [str(i) for i in range(1, 12)]
    for model in manifest["models"]:  # every record named is committed and read through the typed readers
        record = study_findings.study(manifest, model["study"])["record"]
        if record is not None:  # a whole run's record, or a study's cell records (keyheads study)
            assert (ROOT / record / "run" / "stages").is_dir() or any((ROOT / record).glob("*/run/stages")), record


def _manifest(run: Path) -> dict:
    manifest = study_findings.load_manifest()
    manifest["models"] = [{"name": "hand-made", "study": "hand-made"}]
    manifest["studies"] = [{"name": "hand-made", "record": str(run.parent), "config": "-"}]
    return manifest


def test_each_cell_says_the_logged_verdict_and_its_rules_version():
    manifest = study_findings.load_manifest()
    logged = json.loads((ROOT / "studies" / "verdicts.json").read_text())
    table = cells(study_findings.table(manifest))
    for model in manifest["models"]:
        name = study_findings.study(manifest, model["study"])["name"]
        if name not in logged["studies"]:
            continue
        for row, verdict in logged["studies"][name]["verdicts"].items():
            assert table[(row, model["name"])].startswith(f"**{verdict}** (v{RULES_VERSION})"), (name, row)


def test_a_changed_number_in_a_record_changes_its_cell(tmp_path):
    run = make_run(tmp_path / "run", True)
    table = cells(study_findings.table(_manifest(run), root=Path("/")))
    for finding in findings(run):
        assert finding.key in table[(str(finding.row), "hand-made")]
    # the knockout's accuracy with the key heads out: 20% in the record, then 50%
    path = run / "knockout" / "knockout.json"
    data = json.loads(path.read_text())
    assert "→ 20.0%" in table[("3", "hand-made")]
    data["key_heads"]["accuracy_after"] = 0.5
    path.write_text(json.dumps(data))
    changed = cells(study_findings.table(_manifest(run), root=Path("/")))
    assert "→ 50.0%" in changed[("3", "hand-made")] and changed[("3", "hand-made")] != table[("3", "hand-made")]
    assert {k: v for k, v in changed.items() if k[0] != "3"} == {k: v for k, v in table.items() if k[0] != "3"}

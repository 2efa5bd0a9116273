"""The findings table (one row per claim of the paper, one column per model) is said once: README.md and
studies/RESULTS.md carry the same rows."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = "| # | Claim of the paper |"


def findings_table(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_readme_and_results_carry_the_same_findings_table():
    readme, results = findings_table(ROOT / "README.md"), findings_table(ROOT / "studies" / "RESULTS.md")
    assert len(results) == 12  # header, rule and the paper's ten claims
    assert readme == results

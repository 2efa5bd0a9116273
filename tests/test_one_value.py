"""One quantity, one value: no verdict, p-value or accuracy is stated twice with different values anywhere in
README.md and studies/RESULTS.md.

They are all generated: the findings table (the same block in both files) and the study pages are rendered from
the committed records by studies/pages.py. So the test is that (1) none of them is written outside a generated
block, where a second value could contradict the first, and (2) where the generated pages state one finding
twice (the table's cell and the study page's row), they state it the same way."""
import re
from pathlib import Path

import pytest

from keyheads.report.findings import VERDICTS

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "studies" / "RESULTS.md"]
# the generated blocks of README and RESULTS, each from a record: (begin, end) marker prefixes
BLOCKS = [("<!-- findings table:", "<!-- end of findings table -->"), ("<!-- studies:", "<!-- end of studies -->"),
          ("<!-- gpu cost:", "<!-- end of gpu cost -->")]

VERDICT = re.compile(r"\*\*(" + "|".join(map(re.escape, VERDICTS)) + r")\*\*")
# a quoted verdict is a verdict when it is given to a row or a model; else it names the word ('a control decides
# "holds" only ...')
QUOTED = re.compile(r"\"(" + "|".join(map(re.escape, VERDICTS)) + r")\"")
GIVEN_TO = re.compile(r"\brows? \d+|Qwen|SmolLM|Gemma|LLaMA", re.IGNORECASE)
P_VALUE = re.compile(r"\bp(?:-value)?\s*(?:=|≤|<=|<|>|of|is)?\s*(\d*\.\d+(?:e-?\d+)?|\d+e-?\d+)\b")
CRITERION = "0.05"  # "Holm-adjusted p < 0.05": the one significance criterion, a rule and not a measurement
PERCENT = re.compile(r"\d+(?:\.\d+)?\s?%")
ACCURACY = re.compile(r"accura|→|->|correct|right", re.IGNORECASE)


def outside_blocks(text: str) -> str:
    for begin, end in BLOCKS:
        while (start := text.find(begin)) >= 0 and (stop := text.find(end, start)) > start:
            text = text[:start] + text[stop + len(end):]
    return text


def statements(text: str) -> list[str]:
    """The verdicts, p-values and accuracies stated outside the generated blocks."""
    text = outside_blocks(text)
    found = [f"verdict: {m.group(0)}" for m in VERDICT.finditer(text)]
    for line in text.splitlines():
        found += [f"verdict: {line.strip()}" for m in QUOTED.finditer(line) if GIVEN_TO.search(line)]
    found += [f"p-value: {m.group(0)}" for m in P_VALUE.finditer(text) if m.group(1) != CRITERION]
    for line in text.splitlines():
        for m in PERCENT.finditer(line):
            if ACCURACY.search(line[max(0, m.start() - 70):m.end() + 70]):
                found.append(f"accuracy: {line.strip()}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_verdict_p_value_or_accuracy_is_written_outside_a_generated_block(page):
    assert statements(page.read_text()) == []


@pytest.mark.parametrize("added", [
    "On Qwen, row 8 **partly** holds.",
    'Row 8 stays "not testable" on Qwen.',
    "Full SFT's GSM8K losses survive Holm (p 0.046).",
    "The lr-2e-5 losses have Holm p ≤ 3.1e-05.",
    "Knocking out ten random heads costs 6% accuracy.",
    "GSM8K accuracy goes 31.0 → 40.5%.",
])
def test_a_second_value_written_into_the_readme_is_found(added):
    text = (ROOT / "README.md").read_text() + f"\n{added}\n"
    assert len(statements(text)) == 1, added


def test_the_criterion_is_not_a_measurement_and_a_block_s_numbers_are_its_own():
    assert statements("One criterion holds everywhere: Holm-adjusted p < 0.05.") == []
    begin, end = BLOCKS[0]
    assert statements(f"{begin} x -->\n| 1 | **holds**: 90.0% → 10.0%, p 0.001 |\n{end}") == []


def test_each_study_page_states_its_findings_as_the_table_does():
    findings = load_script(ROOT / "studies" / "findings.py", "studies_findings_one_value")
    manifest = findings.load_manifest()
    for model in manifest["models"]:
        study = findings.study(manifest, model["study"])
        if study["record"] is None:
            continue
        column = findings.column(study["record"])
        page = (ROOT / "studies" / "pages" / f"{study['name']}.md").read_text()
        for row, cell in column.items():
            verdict, _, key = cell.partition(": ")
            assert f"| {row} | " in page and f"| {verdict} | {key or '-'} |" in page, (study["name"], row)

"""One quantity, one value: no verdict, p-value, accuracy or measured figure is written by hand where a generated
page states it, or could state it with another value.

The findings table, the study pages, the GPU cost paragraph and the GPU-record sections of bench/RESULTS.md are
rendered from committed records by the scripts their markers name. Outside those generated blocks, the pages may
explain, point and give commands, but not state a result. Three rules check that, on the text outside the blocks:

1. Verdicts, sentence by sentence (README.md, the hand-written pages of studies/, bench/RESULTS.md). The text is
   split into sentences (a heading, a list item, a table row or a line of a code block is one too); a sentence
   fails when it gives a verdict word to a claim or a model:
   - a verdict word: "holds", "partly", "does not hold", "not testable", "not measured" (`VERDICTS`), and
     "hold"/"holds"/"held" where a claim holds: followed by the end of a clause or by "for", "on", "in",
     "there", "everywhere", ... ("Row 7 holds for SmolLM2."), not where a thing holds an object ("the record
     holds its analysis stages");
   - a claim or a model: a row number ("row 7", "rows 7 to 11"), a model's name (SmolLM2, Qwen, Gemma, LLaMA,
     Llama), "claim"/"finding", or the words of a claim ("precise SFT", "key heads", "transfer", ...).
   A verdict in bold (a cell's markup) fails wherever it stands. Allowed, the one exception: a sentence whose
   verdict words are all quoted ("..." or `...`) and that names no row and no model: it names the word of the
   rules ('Missing evidence gives "not measured".'), not a cell.
2. p-values and accuracies (the same pages): a p-value other than the criterion's 0.05, and a percent near
   "accuracy", "correct", "right" or an arrow.
3. Figures (README.md, the hand-written pages of studies/, bench/RESULTS.md, and every comment of configs/*.yaml):
   a measured quantity, that is a number with a unit of measurement (%, s, ms, min, h, hours, GPU-hours, GiB, GB,
   MiB, MB, KB, samples/s, tokens/s, it/s, GFLOP/s, points, or a ratio such as 2.22x), or a decimal or scientific
   number in a clause that says it was measured ("measured", "error", "differs", "largest", "peak", "took", ...),
   or a decimal in a pasted output (a code block that is not a command). Settings and definitions are not
   figures; the allow-list, each entry narrow:
   - the paper's threshold, -5% (`keyheads.effects.PAPER_THRESHOLD`);
   - a confidence level: 95% followed by "interval", "confidence" or "Wilson";
   - a setting's value: directly after "=", a flag (`--gpu-memory 80GiB`) or a setting's name (lr, batch,
     micro-batch, threshold, warm-up, decay, limit, default);
   - a share of a count, "N% of M" with M a number ("3% of 270 heads");
   - a tolerance: directly after "within" ("agree within 1e-5");
   - a reference: directly after "section", "appendix", "table" or "figure" ("section 5.3").
"""
import re
from pathlib import Path

import pytest

from keyheads.report.findings import VERDICTS

ROOT = Path(__file__).resolve().parents[1]
# studies/pages/*.md (a subfolder) and these pages of studies/ are written by scripts from records, whole
GENERATED_PAGES = {ROOT / "studies" / "compiled_circuits.md", ROOT / "studies" / "compare_methods.md"}
STUDY_PAGES = sorted(p for p in (ROOT / "studies").glob("*.md") if p not in GENERATED_PAGES)
PAGES = [ROOT / "README.md", *STUDY_PAGES, ROOT / "bench" / "RESULTS.md"]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
# the generated blocks, each from a record: (begin, end) marker prefixes. A begin marker names the script that
# writes the block ("written by `python SCRIPT ...`"); a block without its end marker is not a block.
BLOCKS = [("<!-- findings table:", "<!-- end of findings table -->"), ("<!-- studies:", "<!-- end of studies -->"),
          ("<!-- gpu cost:", "<!-- end of gpu cost -->"), ("<!-- verdict rules:", "<!-- end of verdict rules -->"),
          ("<!-- verdict changes:", "<!-- end of verdict changes -->"),
          ("<!-- gpu records:", "<!-- end of gpu records -->"),
          ("<!-- bench record:", "<!-- end of bench record -->")]

# --- rule 1: verdicts --------------------------------------------------------------------------------------------
_WORDS = "|".join(re.escape(v) for v in sorted(VERDICTS, key=len, reverse=True) if v != "holds")
# "hold(s)"/"held" of a claim: at a clause's end, or before a preposition or adverb, never before its object
_HOLD = (r"\b(?:holds?|held)\b(?=\s*(?:$|[.,;:!?)\"”'`*]|(?:for|on|in|at|there|here|everywhere|across|beyond|with"
         r"|when|if|under|true|up)\b))")
VERDICT_WORD = re.compile(rf"\b(?:{_WORDS})\b|{_HOLD}", re.IGNORECASE)
BOLD = re.compile(r"\*\*(" + "|".join(map(re.escape, VERDICTS)) + r")\*\*", re.IGNORECASE)
QUOTED = re.compile(rf"[\"“`]({_WORDS}|holds?|held)[\"”`]", re.IGNORECASE)
NAMED = re.compile(r"\brows? \d+|\b(?:SmolLM|Qwen|Gemma|LLaMA|Llama)", re.IGNORECASE)  # a cell's row or column
CLAIM = re.compile(r"\b(?:claims?|findings?|key heads?|precise SFT|full SFT|LoRA|random heads|knockout|transfer|"
                   r"attend|MLPs?|generic|drift|math gain|trains? faster)\b", re.IGNORECASE)

# --- rule 2: p-values and accuracies -----------------------------------------------------------------------------
P_VALUE = re.compile(r"\bp(?:-value)?\s*(?:=|≤|<=|<|>|of|is)?\s*(\d*\.\d+(?:e-?\d+)?|\d+e-?\d+)\b")
CRITERION = "0.05"  # "Holm-adjusted p < 0.05": the significance criterion, a rule and not a measurement
PERCENT = re.compile(r"\d+(?:\.\d+)?\s?%")
ACCURACY = re.compile(r"accura|→|->|correct|right", re.IGNORECASE)

# --- rule 3: figures ---------------------------------------------------------------------------------------------
_NUM = r"(?<![\w.])[-+±~]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
_UNIT = (r"(?:%|×|ms|s|sec|seconds?|mins?|minutes?|h|(?:GPU-|CPU-)?hours?|days?|GiB|GB|MiB|MB|KB|kB|"
         r"samples/s|tokens/s|items/s|it/s|[GT]FLOP/s|points)(?![\w/])")
WITH_UNIT = re.compile(_NUM + r"(?:x(?![\w/])|\s?" + _UNIT + ")")  # a ratio's x is written close: 2.22x
DECIMAL = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d+(?:e[-+]?\d+)?|\d+e[-+]?\d+)(?![\w.]*\d)(?![A-Za-z])")
MEASURED = re.compile(r"\b(?:measured|measures?|measuring|errors?|differ(?:s|ed|ence)?|diff|largest|max|mean|median|"
                      r"best|peak|speed(?:-up)?|took|faster|slower|grows|grew|allocated|resident|came out)\b",
                      re.IGNORECASE)
PAPER_THRESHOLD = "-5%"
CONFIDENCE = re.compile(r"95%\s*(?:interval|confidence|Wilson)", re.IGNORECASE)
SETTING_BEFORE = re.compile(r"(?:=|--[\w.-]+|\b(?:lr|batch|micro-batch|threshold|warm-up|decay|limit|default|within|"
                            r"section|appendix|table|figure))"
                            r"[\s`'\"]*$", re.IGNORECASE)
SHARE_OF_COUNT = re.compile(r"\s*of\s+\d")
COMMAND_FENCES = {"sh", "bash", "shell", "python", "py", "yaml"}


def outside_blocks(text: str) -> str:
    for begin, end in BLOCKS:
        while (start := text.find(begin)) >= 0 and (stop := text.find(end, start)) > start:
            text = text[:start] + text[stop + len(end):]
    return text


def sentences(text: str) -> list[str]:
    """The sentences of a markdown text: paragraphs and list items split after . ! ? before a capital; a heading,
    a table row and each line of a code block are one sentence each."""
    out: list[str] = []
    para: list[str] = []

    def flush() -> None:
        if para:
            out.extend(s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`\"'(*\[])", " ".join(para)) if s.strip())
            para.clear()

    fenced = False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("```"):
            flush()
            fenced = not fenced
        elif fenced or s.startswith(("|", "<!--")):
            flush()
            out.append(s)
        elif s.startswith("#"):  # a heading: a paragraph of its own
            flush()
            para.append(s)
            flush()
        elif not s:
            flush()
        else:
            if re.match(r"(?:[-*] |\d+\. )", s):
                flush()
            para.append(s)
    flush()
    return out


def verdicts(text: str) -> list[str]:
    """Rule 1: the sentences outside the generated blocks that give a verdict to a claim or a model."""
    found = []
    for s in sentences(outside_blocks(text)):
        words = list(VERDICT_WORD.finditer(s))
        if BOLD.search(s):
            found.append(s)
        elif words and (CLAIM.search(s) or NAMED.search(s)):
            quoted = [m.span(1) for m in QUOTED.finditer(s)]
            all_quoted = all(any(a <= w.start() and w.end() <= b for a, b in quoted) for w in words)
            if not all_quoted or NAMED.search(s):
                found.append(s)
    return found


def statements(text: str) -> list[str]:
    """The verdicts, p-values and accuracies stated outside the generated blocks."""
    found = [f"verdict: {s}" for s in verdicts(text)]
    text = outside_blocks(text)
    found += [f"p-value: {m.group(0)}" for m in P_VALUE.finditer(text) if m.group(1) != CRITERION]
    for line in text.splitlines():
        for m in PERCENT.finditer(line):
            if ACCURACY.search(line[max(0, m.start() - 70):m.end() + 70]):
                found.append(f"accuracy: {line.strip()}")
    return found


def _allowed(clause: str, m: re.Match) -> bool:
    figure, before, after = m.group(0).strip(), clause[:m.start()], clause[m.end():]
    return (figure == PAPER_THRESHOLD or bool(CONFIDENCE.match(clause, m.start()))
            or bool(SETTING_BEFORE.search(before[-30:]))
            or figure.endswith("%") and bool(SHARE_OF_COUNT.match(after)))


def _pasted_outputs(text: str) -> list[str]:
    """The code blocks of `text` that are not commands (a pasted output)."""
    blocks = re.findall(r"^\s*```(\w*)\n(.*?)^\s*```", text, flags=re.S | re.M)
    return [body for fence, body in blocks if fence.lower() not in COMMAND_FENCES]


def figures(text: str) -> list[str]:
    """Rule 3: the measured figures written outside the generated blocks."""
    text = outside_blocks(text)
    found = []
    for s in sentences(text):
        for clause in re.split(r";\s", s):
            for m in WITH_UNIT.finditer(clause):
                if not _allowed(clause, m):
                    found.append(f"figure {m.group(0).strip()!r}: {s}")
            if MEASURED.search(clause):
                for m in DECIMAL.finditer(clause):
                    if not WITH_UNIT.match(clause, m.start()) and not _allowed(clause, m):
                        found.append(f"figure {m.group(0)!r}: {s}")
    for body in _pasted_outputs(text):
        found += [f"figure {m.group(0)!r} in a pasted output: {line.strip()}" for line in body.splitlines()
                  for m in DECIMAL.finditer(line)]
    return found


def comments(yaml_text: str) -> str:
    """The comments of a YAML file, whole-line and beside a setting, as one text (a comment line a line)."""
    lines = []
    for line in yaml_text.splitlines():
        m = re.search(r"(?:^|\s)#(.*)$", line)
        if m:
            lines.append(m.group(1).strip())
        elif lines and lines[-1]:
            lines.append("")  # a setting ends the comment's paragraph
    return "\n".join(lines)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_verdict_p_value_or_accuracy_is_written_outside_a_generated_block(page):
    assert statements(page.read_text()) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_figure_is_written_outside_a_generated_block(page):
    assert figures(page.read_text()) == []


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_no_figure_is_written_in_a_config_s_comments(config):
    assert figures(comments(config.read_text())) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_generated_block_names_the_script_that_writes_it(page):
    text = page.read_text()
    for begin, end in BLOCKS:
        for start in (m.start() for m in re.finditer(re.escape(begin), text)):
            marker = text[start:text.index("-->", start)]
            script = re.search(r"written by `python (-m )?([^\s`]+)", marker)
            assert script, marker
            path = script.group(2).replace(".", "/") + ".py" if script.group(1) else script.group(2)
            assert (ROOT / path).is_file(), marker
            assert text.find(end, start) > start, f"{page.name}: {begin} has no {end}"


@pytest.mark.parametrize("page", sorted(GENERATED_PAGES), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_left_out_as_generated_names_the_script_that_writes_it(page):
    assert re.search(r"^Written by `python ([^\s`]+)", page.read_text(), re.M), page


@pytest.mark.parametrize("added", [
    "On Qwen, row 8 **partly** holds.",
    'Row 8 stays "not testable" on Qwen.',
    "Row 7 holds for SmolLM2-135M.",
    "On Qwen the transfer claim partly holds.",
    "SmolLM2's row 11 does not hold.",
    "The claim about precise SFT held on Gemma-3-270M.",
    'Rows 7 to 11 say "not measured" on Qwen until a re-run.',
    "Full SFT's GSM8K losses survive Holm (p 0.046).",
    "The lr-2e-5 losses have Holm p ≤ 3.1e-05.",
    "Knocking out ten random heads costs 6% accuracy.",
    "GSM8K accuracy goes 31.0 → 40.5%.",
])
def test_a_second_value_written_into_the_readme_is_found(added):
    text = (ROOT / "README.md").read_text() + f"\n{added}\n"
    assert len(statements(text)) == 1, added


@pytest.mark.parametrize("sentence", [
    'Missing evidence gives "not measured".',
    'A random control decides "holds" only as a band of draws.',
    "The Qwen2.5-Coder-1.5B record holds its analysis stages only.",
    "Every process holds the whole model.",
    "Does it hold?",
    "The criterion is Holm-adjusted p < 0.05.",
])
def test_a_sentence_about_the_rules_or_a_record_s_contents_is_no_verdict(sentence):
    assert statements(sentence) == []


@pytest.mark.parametrize("page, added", [
    ("bench/RESULTS.md", "Precise SFT trains at 12.3 samples/s on the H100."),
    ("bench/RESULTS.md", "| precise | 0.446 | 1.84x |"),
    ("bench/RESULTS.md", "The fast sweep takes 3.27 s."),
    ("bench/RESULTS.md", "- largest |fast - naive|: 3.43e-05"),
    ("README.md", "On two processes the adapter matches one process's within 1e-5 (1.3e-7 measured)."),
    ("README.md", "The evaluation takes about 25 minutes a row."),
    ("README.md", "A 1.1 GB GGUF in 22 parts."),
    ("README.md", "```text\nfinetune precise   ddp   32.7   yes\n```"),
])
def test_a_figure_written_by_hand_is_found(page, added):
    text = (ROOT / page).read_text() + f"\n\n{added}\n"
    assert len(figures(text)) == 1, added


def test_a_figure_in_a_config_comment_is_found():
    text = (ROOT / "configs" / "table1-smollm2.yaml").read_text()
    assert figures(comments(text + "# The CPU run takes about 40 minutes.\n")) != []
    assert figures(comments(text + "eval:\n  limit: 60   # 4.2 s an item, measured\n")) != []


@pytest.mark.parametrize("sentence", [
    "The recipe: lr 2e-5, batch 128, 2 epochs, warm-up 0.02, weight decay 0.1.",
    "No head reaches the paper's -5% on this model.",
    "Each row with its bootstrap 95% intervals.",
    "patch top-k 8, 3% of 270 heads.",
    "The adapter matches one process's within 1e-5.",
    "`--max-memory cuda:0=20GiB,cpu=60GiB` caps each device; `keyheads plan --gpu-memory 80GiB` plans for one.",
    "Needs `python3` (3.10+); tested with lm-eval 0.4.13.",
])
def test_a_setting_or_a_definition_is_no_figure(sentence):
    assert figures(sentence) == []


def test_a_block_s_figures_and_verdicts_are_its_own():
    for begin, end in BLOCKS:
        text = f"{begin} written by `python x.py` -->\n| 1 | **holds**: 90.0% → 10.0%, p 0.001; 12.3 samples/s |\n{end}"
        assert statements(text) == [] and figures(text) == []
    begin, _ = BLOCKS[0]
    unclosed = f"{begin} written by `python x.py` -->\n| 1 | **holds**: 12.3 samples/s |\n"
    assert statements(unclosed) != [] and figures(unclosed) != []


def test_each_study_page_states_its_findings_as_the_table_does():
    from studies import findings
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

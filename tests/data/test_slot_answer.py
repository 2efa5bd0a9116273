"""Templates whose answer is the value of a slot (tasks beyond arithmetic, e.g. indirect-object identification):
the rendered prompts, the answer, a counterfactual that differs only at the ~ slot, and bad templates named.

With the tiny character tokenizer every character is one token, so same-length names align token by token."""
import re

import pytest

from keyheads.config.run import RunSettings
from keyheads.data.generate import Generator, make_pairs
from keyheads.data.pairs import verify_pair
from keyheads.data.settings import PairSettings
from keyheads.data.templates import TASKS, TemplateError, load_templates
from keyheads.errors import CounterfactualError, MissingFile, SettingError
from keyheads.pipeline import build_stages
from keyheads.testing.tiny import char_tokenizer

QUIET = lambda *a, **k: None  # noqa: E731
NAMES = ["Anna", "Mary", "John", "Paul", "Luke", "Jack", "Emma", "Kate"]  # four letters: four tokens each
IOI = f"""\
pools:
  PERSON: [{", ".join(NAMES)}]
  PLACE: [park, shop, pool]
templates:
  - id: ioi-1
    task: ioi
    text: "When {{IO}} and {{S}} went to the {{PLACE}}, {{S~}} gave a book to {{C}}"
    slots: {{IO: PERSON, S: PERSON}}
    answer: IO
"""
# the template's text as a pattern: IO, S and PLACE captured, S repeated except at the ~ occurrence
REFERENCE = re.compile(r"When (?P<IO>\w+) and (?P<S>\w+) went to the (?P<PLACE>\w+), (?P<S2>\w+) gave a book to ?$")


def write(tmp_path, text, name="ioi.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def ioi(tmp_path):
    return write(tmp_path, IOI)


def test_the_answer_is_the_slot_and_the_counterfactual_changes_only_the_marked_occurrence(ioi):
    templates = load_templates([ioi])
    assert templates.tasks == ["ioi"] and templates.get("ioi-1").answer == "IO"
    tok = char_tokenizer()
    pairs = make_pairs(templates, ["ioi"], PairSettings(n=30, template_files=[str(ioi)], task="ioi"), tokenizer=tok,
                       log=QUIET)
    assert len(pairs) == 30
    for p in pairs:
        ref, cf = REFERENCE.match(p.reference), REFERENCE.match(p.counterfactual)
        assert ref and cf, (p.reference, p.counterfactual)
        io, s = ref["IO"], ref["S"]
        assert io != s and {io, s} <= set(NAMES) and ref["S2"] == s  # the reference repeats the subject
        assert p.answer == io and p.task == "ioi" and p.template == "ioi-1"
        # the counterfactual: the same text with a third name at the subject's second mention, nothing else
        third = cf["S2"]
        assert third in NAMES and third not in (io, s)
        cut = p.reference.rindex(s)
        assert p.counterfactual == p.reference[:cut] + third + p.reference[cut + len(s):]
        assert p.positions is None and p.operands is None  # no operands or operator to point at
        assert verify_pair(tok, p) == []
    assert len({p.reference for p in pairs}) > 20  # the slots are drawn, not fixed


def test_few_shot_examples_show_their_answers_and_avoid_the_questions(ioi):
    tok = char_tokenizer()
    config = PairSettings(n=12, few_shot=2, shared_prefix=True, template_files=[str(ioi)], task="ioi")
    pairs = make_pairs(load_templates([ioi]), ["ioi"], config, tokenizer=tok, log=QUIET)
    prefixes = {p.reference[:p.reference.rindex("\n") + 1] for p in pairs}
    assert len(prefixes) == 1  # one shared prefix for the template
    examples = prefixes.pop().splitlines()
    assert len(examples) == 2
    for line in examples:
        m = re.fullmatch(r"When (\w+) and (\w+) went to the \w+, \2 gave a book to (\w+)", line)
        assert m and m[3] == m[1], line  # each example is solved: its answer is its IO
    shown = {line.rsplit(" ", 1)[1] for line in examples}
    for p in pairs:
        assert p.counterfactual.startswith("\n".join(examples) + "\n")
        assert p.answer not in shown  # a question whose answer an example shows is rejected


def test_no_third_name_of_the_same_length_is_named(tmp_path):
    path = write(tmp_path, IOI.replace(", ".join(NAMES), "Anna, Mary"))  # two names: no third one
    tok = char_tokenizer()
    with pytest.raises(CounterfactualError, match="pool PERSON other than Anna, Mary"):
        Generator(load_templates([path]), tok, PairSettings(n=2)).task("ioi", log=QUIET)


@pytest.mark.parametrize("change, named", [
    (("answer: IO", "answer: IX"), "answer slot {IX} is not in the text"),
    (("answer: IO", "answer: C"), "not C itself"),
    (("answer: IO", "answer: '{IO}'"), "answer must name a slot"),
    (("{S~}", "{S}"), "no slot marked ~"),
    (("{PLACE}", "{PLAZA}"), "unknown slot {PLAZA}"),
    (("PLACE: [park, shop, pool]", "PLACE: []"), "pool PLACE is empty"),
    (("task: ioi", "task: addition"), "addition computes its answer from {A} and {B}"),
    (("task: ioi", "task: IOI task"), "names a task of its own"),
    (("went to", "{OP:plus} to"), "slot {OP} is arithmetic's"),
    (("went to", "{A} to"), "slot {A} is arithmetic's"),
    (("to {C}", "to {C} today"), "{C} must end the text"),
    (("    answer: IO\n", "    answer: IO\n    max_answer: 9\n"), "max_answer"),
    (("    answer: IO\n", ""), "task 'ioi' is not one of"),  # without answer:, a task must be arithmetic
])
def test_bad_answer_slot_templates_are_named(tmp_path, change, named):
    old, new = change
    assert old in IOI
    path = write(tmp_path, IOI.replace(old, new))
    with pytest.raises(TemplateError) as err:
        load_templates([path])
    assert "ioi-1" in str(err.value) or "PLACE" in str(err.value), str(err.value)
    assert named in str(err.value), str(err.value)


def test_the_task_of_a_template_file_is_a_setting_only_with_that_file(ioi, tmp_path):
    def run(**data):
        return RunSettings.make(out=str(tmp_path / "run"), eval={"benchmarks": []}, data=data)

    with pytest.raises(SettingError, match="data.task.*'ioi'"):
        run(task="ioi")
    assert run(task="ioi", template_files=[str(ioi)]).data.task == "ioi"
    with pytest.raises(MissingFile, match="template file .*missing.yaml does not exist"):  # the file's own error
        run(task="ioi", template_files=[str(tmp_path / "missing.yaml")])
    settings = PairSettings(task="ioi", template_files=[str(ioi)])
    assert settings.task == "ioi" and not settings.arithmetic
    assert PairSettings(task="addition").arithmetic
    assert PairSettings(task="all", template_files=["builtin", str(ioi)]).arithmetic is False
    assert load_templates(["builtin", ioi]).tasks == [*TASKS, "ioi"]  # arithmetic first, in TASKS' order


def test_a_run_on_answer_slot_pairs_has_no_attention_or_mlp_stage(ioi, tmp_path):
    """Both read the operands and the operator, which such pairs have not."""
    def stages(**data):
        cfg = RunSettings.make(out=str(tmp_path / "run"), eval={"benchmarks": []}, data=data)
        return [s.name for s in build_stages(cfg, tmp_path / "run", lambda: None)]

    assert stages(task="ioi", template_files=[str(ioi)]) == ["data", "identify", "knockout", "report"]
    assert stages(task="addition") == ["data", "identify", "knockout", "attention", "mlp", "report"]

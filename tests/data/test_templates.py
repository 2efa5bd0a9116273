"""Templates: the paper's sets are complete, parse as written, and bad templates are named."""
import random
import re

import pytest

from keyheads.data.render import draw_fillers, render
from keyheads.data.templates import TASKS, TemplateError, load_templates

SLOT = re.compile(r"\{(\w+)(~?)(?::([^}]*))?\}")


@pytest.fixture(scope="module")
def builtin():
    return load_templates()


def test_builtin_sets_match_the_paper(builtin):
    ids = [t.id for t in builtin.templates]
    assert len(ids) == len(set(ids))
    prefix = {"addition": "add", "subtraction": "sub", "multiplication": "mul", "division": "div"}
    for task, p in prefix.items():  # figure 8: nine per task, in three forms
        fig8 = [t for t in builtin.for_task(task) if re.fullmatch(rf"{p}-(eq|stmt|qa)-\d", t.id)]
        assert len(fig8) == 9, task
        assert {t.id.split("-")[1] for t in fig8} == {"eq", "stmt", "qa"}
    # figure 10: eight time spans and four object accumulations, all addition
    assert len([i for i in ids if i.startswith("add-time-")]) == 8
    assert len([i for i in ids if i.startswith("add-obj-")]) == 4
    assert len(builtin.for_task("addition")) == 9 + 12
    assert [t.text for t in builtin.for_task("exponentiation")] == [
        "{A} {OP:^} {B} = {C}", "{A} to the {OP:power} of {B} equals {C}"]
    assert builtin.tasks == list(TASKS)
    # figure 8 repeats "equals to"; the second copy reads "is equal to" as in figure 9
    for task in prefix:
        stmts = [t.text for t in builtin.for_task(task) if "-stmt-" in t.id]
        assert len(set(stmts)) == 3 and any("is equal to" in s for s in stmts)


def test_render_equals_direct_substitution(builtin):
    """Rendering every template equals a plain regex substitution of its text."""
    rng = random.Random(0)
    for t in builtin.templates:
        values = {"A": "3", "B": "5", **draw_fillers(t, builtin.pools, rng)}
        expected = SLOT.sub(lambda m, values=values: m.group(3) if m.group(1) == "OP" else values.get(m.group(1), ""),
                            t.text)
        r = render(t, values)
        assert r.text == expected, t.id  # {C} renders as nothing: the prompt stops there
        assert r.text[slice(*r.spans["A"])] == "3" and r.text[slice(*r.spans["B"])] == "5"
        assert r.text[slice(*r.spans["operator"])] == t.operator.word


def test_fillers_use_their_pools_and_numbered_slots_differ(builtin):
    rng = random.Random(1)
    t2 = builtin.get("add-obj-2")  # NAME and NAME2
    for _ in range(200):
        v = draw_fillers(t2, builtin.pools, rng)
        assert v["NAME"] != v["NAME2"] and {v["NAME"], v["NAME2"]} <= set(builtin.pools["NAME"])
        assert v["VERB"] in builtin.pools["GAIN_PAST"] and v["OBJECT"] in builtin.pools["OBJECT"]
    assert len(builtin.pools["NAME"]) == len(set(builtin.pools["NAME"])) == 100
    v = draw_fillers(builtin.get("add-time-4"), builtin.pools, rng)
    assert v["VERB"] in builtin.pools["SPAN_BASE"] and v["MONTH"] in builtin.pools["MONTH"]
    v = draw_fillers(builtin.get("add-time-1"), builtin.pools, rng)
    assert v["VERB"] in builtin.pools["SPAN_PAST"] and 100 <= int(v["YYY"]) <= 199
    # pools hold strings only: an unquoted null in YAML would have become "None"
    assert all(isinstance(w, str) and w != "None" for pool in builtin.pools.values() for w in pool)


def write(tmp_path, text, name="mine.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, slot", [
    ("{A} + {B} = {C}", "{OP}"),          # no operator
    ("{A} {OP:+} 4 = {C}", "{B}"),        # no operand B
    ("{A} {OP:+} {B} =", "{C}"),          # no answer
    ("{A} {OP:+} {B} = {C} ok", "{C}"),   # answer not last
    ("{FOO} has {A} {OP:plus} {B} = {C}", "FOO"),  # unknown slot
    ("{A} {OP:+} {B} {B} = {C}", "{B}"),  # operand twice
    ("{A} {OP} {B} = {C}", "OP"),         # operator without its word
])
def test_bad_template_names_template_and_slot(tmp_path, text, slot):
    path = write(tmp_path, f'templates:\n  - {{id: my-bad-1, task: addition, text: "{text}"}}\n')
    with pytest.raises(TemplateError) as err:
        load_templates([path])
    assert "my-bad-1" in str(err.value) and slot in str(err.value)


def test_other_bad_files(tmp_path):
    dup = write(tmp_path, 'templates:\n  - {id: x, task: addition, text: "{A} {OP:+} {B} = {C}"}\n'
                          '  - {id: x, task: addition, text: "{A} {OP:plus} {B} = {C}"}\n')
    with pytest.raises(TemplateError, match="x is defined twice"):
        load_templates([dup])
    task = write(tmp_path, 'templates:\n  - {id: y, task: modulo, text: "{A} {OP:%} {B} = {C}"}\n')
    with pytest.raises(TemplateError, match="template y.*modulo"):
        load_templates([task])
    null = write(tmp_path, 'pools:\n  NONSENSE: [none, null]\ntemplates:\n'
                           '  - {id: z, task: addition, text: "{A} {OP:plus} {B} = {C}"}\n')
    with pytest.raises(TemplateError, match="NONSENSE.*quote"):
        load_templates([null])
    with pytest.raises(FileNotFoundError):
        load_templates([tmp_path / "missing.yaml"])


def test_user_file_with_own_pool_alone_or_with_builtin(tmp_path):
    path = write(tmp_path, "pools:\n  FRUIT: [kiwis, figs]\ntemplates:\n"
                           '  - {id: my-fruit, task: addition, text: "{A} {FRUIT} {OP:plus} {B} {FRUIT~} make {C}"}\n')
    mine = load_templates([path])
    assert [t.id for t in mine.templates] == ["my-fruit"] and mine.pools["FRUIT"] == ["kiwis", "figs"]
    assert "NONSENSE" in mine.pools  # built-in pools stay available
    both = load_templates(["builtin", path])
    assert len(both.templates) == len(load_templates().templates) + 1

"""The generated arith-* sets: fixed items, exact answers, held out from the arithmetic training data,
and evaluated through the ordinary runner (cache, table) without any data folder."""
import hashlib
import json
import os
import re
import subprocess
import sys
from decimal import Decimal

import pytest

from keyheads.data.arithmetic import EitherOrder, NumberRange
from keyheads.data.render import render
from keyheads.data.templates import load_templates
from keyheads.evaluation import ARITH, EvalSettings
from keyheads.evaluation import arith as arith_module
from keyheads.evaluation import tasks as tasks_module
from keyheads.evaluation.arith import (
    ARITH_FIRST,
    ARITH_SETS,
    N_ITEMS,
    N_POOL,
    arith_items,
    check_heldout,
    heldout_templates,
)
from keyheads.evaluation.cache import read_rows
from keyheads.evaluation.extract import NUMBER
from keyheads.evaluation.settings import check_benchmarks
from keyheads.evaluation.tasks import make_task
from keyheads.finetune.data import ARITH_KINDS, arithmetic_examples

from tests.helpers import evaluation, prepared, run_evaluation

TEMPLATED = ("arith-add", "arith-sub", "arith-decimal", "arith-mul", "arith-add4")  # arith-multi: three operands
# Short enough for the tiny models' 256 positions (one character a token).
QUICK = dict(benchmarks=ARITH, few_shot=1, batch_size=8, progress=False)  # settings and the caller's


def _all(name):
    test, pool = arith_items(name)
    return list(test) + list(pool)


def _exact(item):
    """The answer computed directly: Python's own arithmetic (and precedence) on the operands."""
    if item.c is not None:
        assert re.fullmatch(r"[ABC] [-+*] [ABC] [-+*] [ABC]", item.task)
        expression = item.task.replace("A", item.a).replace("B", item.b).replace("C", item.c)
        return Decimal(eval(expression))  # noqa: S307  digits and + - * only, checked above
    a, b = Decimal(item.a), Decimal(item.b)
    return {"addition": a + b, "subtraction": a - b, "multiplication": a * b}[item.task]


@pytest.fixture
def no_data(monkeypatch):
    """No data folder and no hub: the arith sets must not need either."""
    monkeypatch.delenv("KEYHEADS_DATA", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_items_are_fixed_and_shaped_as_documented():
    first = {name: arith_items(name) for name in ARITH}
    arith_items.cache_clear()  # made again from scratch, not served from the cache
    assert {name: arith_items(name) for name in ARITH} == first
    assert ARITH == ("arith-add", "arith-sub", "arith-decimal", "arith-mul", "arith-add4", "arith-multi")
    assert ARITH[:3] == ARITH_FIRST  # the demo keeps the sets it had
    templates = {t.id: t for t in heldout_templates()}
    for name in ARITH:
        test, pool = arith_items(name)
        assert len(test) == N_ITEMS == 300 and len(pool) == N_POOL
        assert [t.id for t in test[:3]] == [f"{name}/0", f"{name}/1", f"{name}/2"] and pool[0].id == f"{name}/shot-0"
        for item in test + pool:
            assert re.fullmatch(r"Q: .+[.?] A:", item.question)
            if name in TEMPLATED:
                assert item.c is None
                assert item.question == render(templates[item.template], {"A": item.a, "B": item.b}).text.rstrip()
    add, sub, dec = (_all(n) for n in ARITH[:3])
    assert all(re.fullmatch(r"[1-9]\d", x) for i in add + sub for x in (i.a, i.b))
    assert {i.task for i in add} == {"addition"} and {i.task for i in sub} == {"subtraction"}
    assert all(Decimal(i.a) >= Decimal(i.b) for i in sub + dec if i.task == "subtraction")  # no negative answers
    assert [i.task for i in dec[:4]] == ["addition", "subtraction"] * 2
    assert all(re.fullmatch(r"[1-9]\d\.\d", x) for i in dec for x in (i.a, i.b))
    # the phrasings take turns, so the first few items of --limit already cover all of them
    assert [i.template for i in add[:4]] == ["add-heldout-1", "add-heldout-2", "add-heldout-3", "add-heldout-1"]


def test_harder_sets_are_shaped_as_documented():
    mul, add4, multi = (_all(n) for n in ("arith-mul", "arith-add4", "arith-multi"))
    assert {i.task for i in mul} == {"multiplication"} and {i.task for i in add4} == {"addition"}
    assert all(re.fullmatch(r"[1-9]\d", x) for i in mul + multi for x in (i.a, i.b, i.c) if x is not None)
    assert all(re.fullmatch(r"[1-9]\d{3}", x) for i in add4 for x in (i.a, i.b))
    assert [i.template for i in mul[:3]] == ["mul-heldout-1", "mul-heldout-2", "mul-heldout-3"]
    # the shapes take turns item by item, the phrasings shape by shape: 9 items cover every pairing
    assert [i.task for i in multi[:4]] == ["A + B - C", "A - B + C", "A + B * C", "A + B - C"]
    assert len({(i.task, i.template) for i in multi[:9]}) == 9
    for item in multi:
        expression = item.task.replace("A", item.a).replace("B", item.b).replace("C", item.c)
        assert item.question in (f"Q: Compute {expression}. A:", f"Q: What is the value of {expression}? A:",
                                 f"Q: Work out {expression}. A:")
        assert int(item.answer) >= 0  # never negative, like arith-sub
    # * binds first: 12 + 30 * 58 is 1752, not 2436
    first_product = next(i for i in multi if i.task == "A + B * C")
    a, b, c = (int(x) for x in (first_product.a, first_product.b, first_product.c))
    assert int(first_product.answer) == a + b * c != (a + b) * c
    # every answer fits the arith generation budget (8 tokens: a space, the digits, the newline)
    assert max(len(i.answer) for n in ARITH for i in _all(n)) <= 6


def test_items_are_the_same_in_another_process():
    """A str seed goes through sha512, not hash(): another process (other PYTHONHASHSEED) agrees."""
    code = ("import hashlib, json; from keyheads.evaluation.arith import ARITH_SETS, arith_items; "
            "print(hashlib.sha256(json.dumps([[i.question, i.answer] for n in ARITH_SETS for part in arith_items(n) "
            "for i in part]).encode()).hexdigest())")
    mine = hashlib.sha256(json.dumps([[i.question, i.answer] for n in ARITH_SETS for part in arith_items(n)
                                      for i in part]).encode()).hexdigest()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert out.stdout.strip() == mine


def test_answers_are_exact():
    for name in ARITH:
        for item in _all(name):
            assert Decimal(item.answer) == _exact(item)
            operands = [item.a, item.b] + ([item.c] if item.c is not None else [])
            assert sorted(re.findall(NUMBER, item.question)) == sorted(operands)
        task = make_task(name, EvalSettings(limit=20))
        test, _ = arith_items(name)
        assert [it.record.answer for it in task.items] == [float(t.answer) for t in test[:20]]
    assert all(re.fullmatch(r"\d+\.\d", i.answer) for i in _all("arith-decimal"))  # as many decimals as the operands


def test_limit_takes_the_first_items_and_exemplars_come_from_the_pool():
    full, short = make_task("arith-sub", EvalSettings()), make_task("arith-sub", EvalSettings(limit=7))
    assert len(full.items) == N_ITEMS and [it.prompt for it in short.items] == [it.prompt for it in full.items[:7]]
    test, pool = arith_items("arith-sub")
    shots = {e.id: e for e in pool}
    assert len(full.exemplars) == 4 and all(e.id in shots for e in full.exemplars)
    lines = full.items[0].prompt.split("\n")  # the solved exemplars, one a line, then the question
    assert lines == [f"{shots[e.id].question} {shots[e.id].answer}" for e in full.exemplars] + [test[0].question]
    # no exemplar repeats a test question, in any phrasing
    assert not {(i.task, i.a, i.b) for i in test} & {(i.task, i.a, i.b) for i in pool}
    # the seed picks other exemplars, never other test items
    other = make_task("arith-sub", EvalSettings(seed=1))
    assert [e.id for e in other.exemplars] != [e.id for e in full.exemplars]
    assert [it.record.id for it in other.items] == [it.record.id for it in full.items]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_evaluation_question_is_a_training_prompt(seed):
    n = 2000  # what `--train arith:KINDS` draws per kind without an explicit N
    training = [e.prompt for kind in ARITH_KINDS for e in arithmetic_examples(kind, n, seed)]
    skeleton = lambda text: re.sub(NUMBER, "#", text.strip())  # noqa: E731  the phrasing, operands blanked
    trained_prompts, trained_phrasings = {p.strip() for p in training}, {skeleton(p) for p in training}
    trained_numbers = {x for p in training for x in re.findall(NUMBER, p)}
    for name in ARITH:
        for item in _all(name):
            assert item.question not in trained_prompts and skeleton(item.question) not in trained_phrasings
            assert item.a not in trained_numbers and item.b not in trained_numbers and item.c not in trained_numbers
        for it in make_task(name, EvalSettings(limit=50)).items:  # whole prompts, exemplars included
            assert not any(line.strip() in trained_prompts for line in it.prompt.split("\n"))


def test_heldout_is_checked_not_assumed(monkeypatch):
    templates = heldout_templates()
    check_heldout(templates)  # the shipped sets pass
    builtin = load_templates().get("add-qa-2")
    with pytest.raises(RuntimeError, match="add-qa-2 are also builtin templates"):
        check_heldout(templates + [builtin])
    for spec in ARITH_SETS.values():
        assert not any(spec.operands.overlaps(r) for _, r in ARITH_KINDS.values())
    monkeypatch.setitem(ARITH_KINDS, "wide", (("addition",), NumberRange("1", "99999")))
    with pytest.raises(RuntimeError, match="arith-add: operands 10..99 overlap 1..99999.*'wide'"):
        check_heldout(templates)


@pytest.mark.parametrize("trained, message", [
    # reaches into arith-add4's four digits only
    (NumberRange("5000", "20000"), "arith-add4: operands 1000..9999 overlap 5000..20000.*'close'"),
    # the second, small range of a product kind is checked too: 10 is a two-digit operand
    (EitherOrder(NumberRange("100", "999"), NumberRange("2", "10")),
     "arith-add: operands 10..99 overlap 100..999 with 2..10.*'close'"),
])
def test_harder_training_kinds_must_stay_clear_of_the_sets(monkeypatch, trained, message):
    check_heldout(heldout_templates())
    monkeypatch.setitem(ARITH_KINDS, "close", (("multiplication",), trained))
    with pytest.raises(RuntimeError, match=message):
        check_heldout(heldout_templates())
    arith_items.cache_clear()
    with pytest.raises(RuntimeError, match=message):
        arith_items("arith-mul")  # the items are not made while the check fails


def test_multi_phrasings_must_not_be_builtin(monkeypatch):
    monkeypatch.setitem(arith_module.MULTI_PHRASINGS, "add-qa-2", "Q: Tell me {E}. A:")
    with pytest.raises(RuntimeError, match="add-qa-2 share the id of a builtin template"):
        check_heldout(heldout_templates())


def test_known_benchmarks():
    assert check_benchmarks(["arith-add", "gsm8k"]) == ("arith-add", "gsm8k")
    assert check_benchmarks(["arith-mul", "arith-add4", "arith-multi"]) == ("arith-mul", "arith-add4", "arith-multi")
    with pytest.raises(ValueError, match="known: gsm8k, addsub, singleeq, svamp, mmlu, csqa, mmlu-humanities, "
                                         "mmlu-stem, mmlu-social-sciences, mmlu-other, arith-add, arith-sub, "
                                         "arith-decimal, arith-mul, arith-add4, arith-multi"):
        check_benchmarks(["arith-div"])


def test_evaluation_needs_no_data_and_reruns_from_the_cache(tiny, tmp_path, no_data, monkeypatch):
    cfg = evaluation(cache_dir=tmp_path / "cache", limit=5, **QUICK)
    first = run_evaluation([prepared(tiny, label="tiny")], cfg, tmp_path / "run")[0]["benchmarks"]
    table = (tmp_path / "run" / "table.md").read_text()
    assert table.startswith("| Model | Train speed | Tuned params | arith-add Acc. | arith-add Δ | arith-sub Acc. |")
    for name in ARITH:
        s = first[name]
        assert (s["n"], s["split"], s["few_shot"], s["max_new_tokens"]) == (5, "generated", 1, 8)
        assert f"| tiny | {name} | generated | 5 | {s['correct']} |" in table
        assert s["timing"]["computed"] == 5
        rows = read_rows(tmp_path / "cache" / f"{name}.sqlite")
        assert len(rows) == 5 and all(r["finish"] in ("stop", "eos", "length") for r in rows)
        assert all("\n" not in r["output"] for r in rows)  # cut at the end of the answer's line
        wrong = [x for x in (tmp_path / "run" / "tiny" / f"{name}.wrong.jsonl").read_text().split("\n") if x]
        assert len(wrong) == 5 - s["correct"]

    def no_generation(*args, **kwargs):
        raise AssertionError("a re-run generated instead of reading the cache")

    monkeypatch.setattr(tasks_module, "generate_stream", no_generation)
    again = run_evaluation([prepared(tiny, label="tiny")], cfg, tmp_path / "again")[0]["benchmarks"]
    for name in ARITH:
        assert again[name]["timing"]["computed"] == 0 and again[name]["timing"]["cached"] == 5
        assert again[name]["correct"] == first[name]["correct"]


@pytest.mark.parametrize("says, accuracy", [
    ("{answer}", 1.0),
    ("{answer} because 17 + 4 = 21", 1.0),  # the first number counts, not the last
    ("{wrong}", 0.0),
    ("about {wrong}, that is {answer}", 0.0),
    ("no idea", 0.0),
])
def test_scoring(tiny, tmp_path, no_data, monkeypatch, says, accuracy):
    cfg = evaluation(cache_dir=tmp_path / "cache", limit=10, **QUICK)
    answers = {}  # prompt tokens -> the right answer
    for name in ARITH:
        for it, item in zip(make_task(name, cfg.settings).items, arith_items(name)[0]):
            answers[tuple(tiny.tokenizer(it.prompt)["input_ids"])] = Decimal(item.answer)

    def fake(model, rows, budget, stop, prefix=None, batch_size=None):
        """What the engine does with a model that says `says` and then starts the next question."""
        for j, row in enumerate(rows):
            answer = answers[tuple(row)]
            text = " " + says.format(answer=answer, wrong=answer + 1) + "\nQ: Compute 1 + 2. A: 3"
            yield j, (text[:stop(text)], "stop")

    monkeypatch.setattr(tasks_module, "generate_stream", fake)
    result = run_evaluation([prepared(tiny, label="t")], cfg, tmp_path / "run")[0]["benchmarks"]
    for name in ARITH:
        assert (result[name]["n"], result[name]["accuracy"]) == (10, accuracy)
    assert result["arith-add"]["no_number"] == (10 if says == "no idea" else 0)


def test_cli_runs_the_arith_sets_without_a_data_folder(tiny, tmp_path, no_data, capsys):
    from keyheads.cli import main

    folder = tmp_path / "tiny-model"
    tiny.hf.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    argv = ["eval", "--model", str(folder), "--device", "cpu", "--benchmarks", "arith-add,arith-decimal",
            "--limit", "3", "--few-shot", "1", "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "run"),
            "--quiet"]
    assert main(argv) == 0
    header = capsys.readouterr().out.split("\n")[0]
    assert header == ("| Model | Train speed | Tuned params | arith-add Acc. | arith-add Δ | arith-decimal Acc. | "
                      "arith-decimal Δ |")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [b["n"] for b in results["variants"][0]["benchmarks"].values()] == [3, 3]

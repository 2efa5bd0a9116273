"""`--train arith:...`: only templates that stay true for multi-digit and decimal operands, and the
operands and exact answers each kind documents."""
import re
from decimal import Decimal

import pytest

from keyheads.data.arithmetic import ARITH_KINDS, EitherOrder, NumberRange
from keyheads.data.templates import load_templates
from keyheads.evaluation.extract import NUMBER
from keyheads.finetune import data as ft_data


@pytest.mark.parametrize("kind", list(ft_data.ARITH_KINDS))
def test_arithmetic_examples_skip_templates_bounded_by_max_answer(kind, monkeypatch):
    used = []
    real = ft_data.render

    def spy(template, values):
        used.append(template)
        return real(template, values)

    monkeypatch.setattr(ft_data, "render", spy)
    examples = ft_data.arithmetic_examples(kind, 300, seed=0)
    tasks = ft_data.ARITH_KINDS[kind][0]
    bounded = {t.id for task in tasks for t in load_templates().for_task(task) if t.max_answer is not None}
    # the tasks do have such templates (time spans, dates): the filter matters; no multiplication
    # template is bounded
    assert bounded or tasks == ("multiplication",)
    assert used and not {t.id for t in used} & bounded
    assert len({t.id for t in used}) >= 8 and len(examples) == 300
    assert not any("from the year" in e.prompt for e in examples)


def _operands(example):
    """The two operands of a rendered builtin template (the only numbers in these prompts)."""
    numbers = re.findall(NUMBER, example.prompt)
    assert len(numbers) == 2, example.prompt
    return numbers


@pytest.mark.parametrize("kind, operands, pattern", [
    ("fivedigit", r"[1-9]\d{4}", None),
    ("multiply", r"[1-9]\d\d", r"[2-9]"),
])
def test_harder_kinds_draw_their_operands_with_exact_answers(kind, operands, pattern):
    examples = ft_data.arithmetic_examples(kind, 400, seed=3)
    shapes = []
    for e in examples:
        a, b = _operands(e)
        if pattern is None:
            assert re.fullmatch(operands, a) and re.fullmatch(operands, b)
            exact = {Decimal(a) + Decimal(b), abs(Decimal(a) - Decimal(b))}  # which one the template shows
        else:
            big_first = re.fullmatch(operands, a) and re.fullmatch(pattern, b)
            small_first = re.fullmatch(pattern, a) and re.fullmatch(operands, b)
            assert big_first or small_first, e.prompt
            shapes.append("big first" if big_first else "small first")
            exact = {Decimal(a) * Decimal(b)}
        assert Decimal(e.completion.strip()) in exact and e.completion.endswith("\n")
    if pattern is not None:  # both orders, about half each
        assert 150 < shapes.count("big first") < 250


def test_either_order_draws_each_range_once_and_reports_both():
    operands = ARITH_KINDS["multiply"][1]
    assert isinstance(operands, EitherOrder)
    assert operands.ranges == (NumberRange("100", "999"), NumberRange("2", "9"))
    assert NumberRange("2", "5").overlaps(operands) and NumberRange("500", "1000").overlaps(operands)
    assert not NumberRange("10", "99").overlaps(operands)
    assert str(operands) == "100..999 with 2..9"

"""`--train arith:...`: only templates that stay true for multi-digit and decimal operands."""
import pytest

from keyheads.data.templates import load_templates
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
    assert bounded  # the tasks do have such templates (time spans, dates): the filter matters
    assert used and not {t.id for t in used} & bounded
    assert len({t.id for t in used}) >= 8 and len(examples) == 300
    assert not any("from the year" in e.prompt for e in examples)

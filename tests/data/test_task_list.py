"""The data settings' `task`: one task, several with commas, or all; a bad name is refused up front."""
import pytest

from keyheads.config.run import RunSettings
from keyheads.data.generate import pairs_for
from keyheads.data.settings import PairSettings, parse_tasks
from keyheads.data.templates import TASKS
from keyheads.errors import SettingError
from keyheads.testing.tiny import tiny_model

QUIET = lambda *a, **k: None  # noqa: E731


@pytest.mark.parametrize("text, tasks", [
    ("addition", ["addition"]),
    ("division,addition", ["division", "addition"]),  # in the order given
    (" subtraction , multiplication ", ["subtraction", "multiplication"]),
    (",".join(TASKS), list(TASKS)),
])
def test_a_task_list_is_the_tasks_it_names(text, tasks):
    assert parse_tasks(text) == tasks
    assert PairSettings(task=text).task == ",".join(tasks)  # kept as one canonical string


@pytest.mark.parametrize("text, named", [
    ("additon", "'additon'"),
    ("addition,integration", "'integration'"),
    ("addition,all", "'all'"),  # all is not one of a list
    ("addition,,division", "''"),
    ("addition,addition", "named twice"),
])
def test_a_bad_task_is_named_with_the_valid_ones(text, named):
    with pytest.raises(SettingError) as err:
        parse_tasks(text)
    message = str(err.value)
    assert named in message and all(t in message for t in TASKS), message
    with pytest.raises(SettingError) as err:  # the run config names the setting, the task and the valid ones
        RunSettings.make(out="runs/x", eval={"benchmarks": []}, data={"task": text})
    assert "data.task" in str(err.value) and named in str(err.value) and "exponentiation" in str(err.value)


def test_all_is_still_every_templates_task():
    assert PairSettings(task="all").task == "all"


def test_a_list_generates_each_of_its_tasks_as_alone():
    model = tiny_model("llama")
    listed = pairs_for(model, PairSettings(n=6, task="multiplication,addition"), log=QUIET, progress=False)
    alone = {t: pairs_for(model, PairSettings(n=6, task=t), log=QUIET, progress=False)
             for t in ("addition", "multiplication")}
    assert [p.task for p in listed] == ["multiplication"] * 6 + ["addition"] * 6
    assert [p.to_dict() for p in listed] == [p.to_dict() for t in ("multiplication", "addition") for p in alone[t]]

"""An MMLU category as a benchmark of its own (appendix E knocks the key heads out on MMLU-Humanities): MMLU's
test questions of the category's subjects, prompted as `mmlu` prompts them, and scored once for both."""
import shutil

from keyheads.config.run import RunSettings
from keyheads.data.benchmarks import load
from keyheads.evaluation import EvalSettings
from keyheads.evaluation.settings import DISPLAY
from keyheads.evaluation.tasks import make_task

from tests.helpers import evaluation, prepared, run_evaluation

# MMLU's humanities subjects, written out (Hendrycks et al. 2021's categories, as lm-evaluation-harness groups them)
HUMANITIES = {"formal_logic", "high_school_european_history", "high_school_us_history", "high_school_world_history",
              "international_law", "jurisprudence", "logical_fallacies", "moral_disputes", "moral_scenarios",
              "philosophy", "prehistory", "professional_law", "world_religions"}
CATEGORIES = ("mmlu-humanities", "mmlu-stem", "mmlu-social-sciences", "mmlu-other")


def test_humanities_is_mmlus_humanities_questions_prompted_as_mmlu_prompts_them(shared_data):
    tasks = {name: make_task(name, EvalSettings(), str(shared_data)) for name in ("mmlu", *CATEGORIES)}
    want = {r.id for r in load("mmlu", data_dir=shared_data) if r.subject in HUMANITIES}
    got = {it.record.id for it in tasks["mmlu-humanities"].items}
    assert got == want and len(got) == 4705  # MMLU-Humanities' published size
    prompts = {it.record.id: it.prompt for it in tasks["mmlu"].items}
    assert all(prompts[it.record.id] == it.prompt for it in tasks["mmlu-humanities"].items)
    # the four categories split MMLU: every question in exactly one
    ids = [it.record.id for name in CATEGORIES for it in tasks[name].items]
    assert len(ids) == len(set(ids)) and set(ids) == set(prompts)
    assert DISPLAY["mmlu-humanities"] == "MMLU-Humanities"


def test_a_category_is_scored_from_mmlus_cache(tiny, tiny_data, tmp_path):
    """A category's items are MMLU's, cached under MMLU: what one of them scored, the other reads back."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    for split in ("dev", "test"):  # the tiny set's two subjects become one of humanities and one of STEM
        for old, new in (("math", "formal_logic"), ("science", "astronomy")):
            (data / "mmlu" / split / f"{old}_{split}.csv").rename(data / "mmlu" / split / f"{new}_{split}.csv")
    humanities = run_evaluation([prepared(tiny)], evaluation(data, tmp_path / "cache", few_shot=1, progress=False,
                                                             benchmarks=("mmlu-humanities",)),
                                tmp_path / "a")[0]["benchmarks"]["mmlu-humanities"]
    assert humanities["timing"]["computed"] == humanities["n"] == 3 and set(humanities["subjects"]) == {"formal_logic"}
    mmlu = run_evaluation([prepared(tiny)], evaluation(data, tmp_path / "cache", few_shot=1, progress=False,
                                                       benchmarks=("mmlu",)), tmp_path / "b")[0]["benchmarks"]["mmlu"]
    assert mmlu["timing"] == {**mmlu["timing"], "computed": mmlu["n"] - 3, "cached": 3}
    assert mmlu["subjects"]["formal_logic"] == humanities["subjects"]["formal_logic"]


def test_a_run_config_takes_a_category(tmp_path, shared_data):
    cfg = RunSettings.make(out=str(tmp_path / "run"), data_dir=str(shared_data),
                           eval={"benchmarks": ["mmlu", "mmlu-humanities"]})
    assert cfg.eval.benchmarks == ("mmlu", "mmlu-humanities")

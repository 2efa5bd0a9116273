"""also_identify: each named set becomes a stage identify/NAME that makes that set's pairs and path-patches
them as the identify stage does; the report sets them side by side with their key heads in common."""
import json
import logging

import pytest

from keyheads.config.run import RunSettings, merge_settings
from keyheads.errors import NothingCorrect, SettingError
from keyheads.heads import heads_of
from keyheads.patching import identify
from keyheads.pipeline import run_pipeline
from keyheads.testing import tiny_model

from tests.report.page import section_text, table_rows

pytestmark = pytest.mark.slow  # a few small pipelines, about 20 s in all

SETS = ["division", "exponentiation", "gsm8k"]


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture
def run(tmp_path, llama, monkeypatch):
    monkeypatch.setattr("keyheads.models.loading.load_model", lambda *a, **k: llama)
    return tmp_path / "run"


def config(run, data_dir, **kw):
    # a random model answers nothing right: every candidate pair is kept
    base = dict(model="tiny", out=str(run), data_dir=str(data_dir), variants=[], eval=dict(benchmarks=[]),
                data=dict(n=4, keep_correct=False), identify=dict(top_k=3), also_identify=SETS, batch_size=8)
    return RunSettings.make(**merge_settings(base, kw))


def ran(caplog):
    lines = [line for m in caplog.messages for line in m.splitlines()]
    caplog.clear()
    return {line.split("]")[0][1:] for line in lines if line.startswith("[") and "] running" in line}


def read(path):
    return json.loads(path.read_text())


def test_each_set_is_identified_as_the_identify_function_does(run, tiny_data, llama, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="keyheads")
    cfg = config(run, tiny_data)
    run_pipeline(cfg, stages=["data", "identify", "report"])
    assert ran(caplog) == {"data", "identify", "report", *(f"identify/{name}" for name in SETS)}
    for name in SETS:
        folder = run / "identify" / name
        pairs = [json.loads(line) for line in (folder / "pairs.jsonl").read_text().splitlines()]
        assert pairs and {p["task"] for p in pairs} == {name}
        # the same pairs, patched directly: the stage's effects are the function's
        found = identify(llama, folder / "pairs.jsonl", cfg.identify, tmp_path / "direct" / name, progress=False)
        assert read(folder / "effects.json")["heads"] == read(tmp_path / "direct" / name / "effects.json")["heads"]
        assert read(folder / "key_heads.json")["heads"] == found.key_heads.to_json()["heads"]
    assert all(p["reference"].startswith("Q: ") for p in map(json.loads, (run / "identify" / "gsm8k" / "pairs.jsonl")
                                                              .read_text().splitlines()))
    # the main stage's record holds none of their files: each set is its own stage's
    assert not [k for k in read(run / "stages" / "identify.json")["outputs"] if k.count("/") > 1]

    # the report: their heatmaps side by side, and the overlaps are the key-head sets' intersections
    page = (run / "report.html").read_text()
    part = section_text(page, "identify-sets")
    assert part.count("<img") == len(SETS) and '<div class="side-by-side">' in part
    keys = {"main": heads_of(read(run / "identify" / "key_heads.json")["heads"])}
    keys |= {name: heads_of(read(run / "identify" / name / "key_heads.json")["heads"]) for name in SETS}
    rows = table_rows(part, "key-head-overlap")
    assert len(rows) == len(keys) * (len(keys) - 1) // 2
    for row in rows:
        a, b, k, shared = row[0][1], row[1][1], int(row[2][0]), int(row[3][0])
        assert shared == len(set(keys[a][:k]) & set(keys[b][:k])), (a, b)
    assert [r[0][1] for r in table_rows(part, "key-head-sets")] == ["main", *SETS]

    # a re-run runs nothing; a patch setting re-runs every identification, a data setting only the task sets
    run_pipeline(cfg, stages=["data", "identify", "report"])
    assert ran(caplog) == set()
    run_pipeline(config(run, tiny_data, identify=dict(top_k=2)), stages=["data", "identify", "report"])
    assert ran(caplog) == {"identify", "report", *(f"identify/{name}" for name in SETS)}
    run_pipeline(config(run, tiny_data, identify=dict(top_k=2), data=dict(few_shot=1)),
                 stages=["data", "identify", "report"])
    assert ran(caplog) == {"data", "identify", "identify/division", "identify/exponentiation", "report"}
    assert (run / "identify" / "gsm8k" / "key_heads.json").is_file()  # the main stage's re-run kept the sets

    # a set taken out of the config leaves its folder, but the report shows only the sets the config lists
    run_pipeline(config(run, tiny_data, identify=dict(top_k=2), data=dict(few_shot=1), also_identify=["gsm8k"]),
                 stages=["report"])
    part = section_text((run / "report.html").read_text(), "identify-sets")
    assert [r[0][1] for r in table_rows(part, "key-head-sets")] == ["main", "gsm8k"] and part.count("<img") == 1


def test_no_sets_no_section(run, tiny_data):
    run_pipeline(config(run, tiny_data, also_identify=[]), stages=["data", "identify", "report"])
    page = (run / "report.html").read_text()
    assert 'id="identify-sets"' not in page and "#identify-sets" not in page


def test_a_set_the_model_answers_nothing_of_says_what_to_change(run, tiny_data):
    cfg = config(run, tiny_data, data=dict(keep_correct=True))
    for name in ("division", "gsm8k"):
        with pytest.raises(NothingCorrect) as err:
            run_pipeline(cfg, stages=[f"identify/{name}"])
        message = str(err.value)
        assert "\n" not in message and f"identify/{name}" in message
        assert "also_identify" in message and "data.keep_correct: false" in message


@pytest.mark.parametrize("values, named", [
    ({"also_identify": ["addition", "integration"]}, "'integration'"),
    ({"also_identify": ["division", "division"]}, "listed twice"),
    ({"also_identify": ["gsm8k"], "data_dir": None}, "data_dir"),
    ({"also_identify": ["division"], "data": {"templates": ["add-eq-1"]}}, "data.templates"),
])
def test_bad_sets_are_refused_up_front(values, named, tmp_path, monkeypatch):
    monkeypatch.delenv("KEYHEADS_DATA", raising=False)
    with pytest.raises(SettingError, match=named):
        RunSettings.make(**merge_settings({"out": str(tmp_path / "r"), "eval": {"benchmarks": []}}, values))

"""The evaluator: per-item cache, resume, knockout variants, the table, bad input."""
import csv
import io
import json
import subprocess
import sys

import pytest

from keyheads.data.benchmarks import DataNotFound, question_key
from keyheads.data.trainset import SplitSettings, build_trainset
from keyheads.evaluation import EvalSettings, Prepared, Variant, prepare
from keyheads.evaluation import tasks as tasks_module
from keyheads.evaluation import variants as variants_module
from keyheads.evaluation.cache import ResultCache, read_rows
from keyheads.evaluation.settings import TABLE_BENCHMARKS, check_benchmarks
from keyheads.evaluation.table import to_csv, to_markdown
from keyheads.evaluation.tasks import make_task
from keyheads.heads import read_heads
from keyheads.results.evaluation import VariantResult

from tests.helpers import evaluation, prepared, run_evaluation

pytestmark = pytest.mark.slow  # whole evaluation runs, several seconds each

QUICK = dict(few_shot=1, max_new_tokens=6, batch_size=4, progress=False)


class Counter:
    """Counts forward calls of a transformers model."""

    def __init__(self, model):
        self.calls = 0
        self.handle = model.hf.register_forward_pre_hook(self._count)

    def _count(self, *_):
        self.calls += 1

    def close(self):
        self.handle.remove()


def _cfg(tiny_data, tmp_path, **kw):
    return evaluation(tiny_data, tmp_path / "cache", **{**QUICK, **kw})


def test_second_run_is_served_from_the_cache(tiny, tiny_data, tmp_path):
    cfg = _cfg(tiny_data, tmp_path)
    counter = Counter(tiny)
    try:
        first = run_evaluation([prepared(tiny)], cfg, tmp_path / "a")
        assert counter.calls > 0
        counter.calls = 0
        second = run_evaluation([prepared(tiny)], cfg, tmp_path / "b")
        assert counter.calls == 0
    finally:
        counter.close()
    for name in TABLE_BENCHMARKS:
        a, b = first[0]["benchmarks"][name], second[0]["benchmarks"][name]
        assert (a["n"], a["correct"]) == (b["n"], b["correct"]) and b["timing"]["computed"] == 0
    # a cache row per item and benchmark
    for name in TABLE_BENCHMARKS:
        assert len(read_rows(tmp_path / "cache" / f"{name}.sqlite")) == first[0]["benchmarks"][name]["n"]


def test_interrupted_run_resumes_and_matches_a_clean_run(tiny, tiny_data, tmp_path, monkeypatch):
    cfg = _cfg(tiny_data, tmp_path, benchmarks=("gsm8k",), batch_size=2)
    real_run = tasks_module.MathTask.run

    def flaky(self, model, items, prefix, cfg, batch_size):
        """Interrupted after two items have ended, while others are still being generated."""
        for n, result in enumerate(real_run(self, model, items, prefix, cfg, batch_size)):
            if n == 2:
                raise KeyboardInterrupt
            yield result

    monkeypatch.setattr(tasks_module.MathTask, "run", flaky)
    with pytest.raises(KeyboardInterrupt):
        run_evaluation([prepared(tiny)], cfg, tmp_path / "run")
    cache_file = tmp_path / "cache" / "gsm8k.sqlite"
    assert len(read_rows(cache_file)) == 2  # the items that had ended were kept
    crash_mid_write(cache_file)
    monkeypatch.setattr(tasks_module.MathTask, "run", real_run)

    counter = Counter(tiny)
    try:
        resumed = run_evaluation([prepared(tiny)], cfg, tmp_path / "run")[0]["benchmarks"]["gsm8k"]
    finally:
        counter.close()
    assert resumed["timing"] == {**resumed["timing"], "computed": 4, "cached": 2}
    rows = read_rows(cache_file)
    assert len(rows) == 6 and "abc" not in {r["key"] for r in rows}  # the half-written batch is gone
    clean = run_evaluation([prepared(tiny)], _cfg(tiny_data, tmp_path / "clean", benchmarks=("gsm8k",)),
                     tmp_path / "clean")[0]["benchmarks"]["gsm8k"]
    assert (clean["n"], clean["correct"]) == (resumed["n"], resumed["correct"])
    wrong = lambda p: [json.loads(x)["output"] for x in p.read_text().split("\n") if x]  # noqa: E731
    assert wrong(tmp_path / "run" / "tiny-llama" / "gsm8k.wrong.jsonl") == \
        wrong(tmp_path / "clean" / "tiny-llama" / "gsm8k.wrong.jsonl")


def crash_mid_write(path):
    """A process killed inside a batch's transaction (after the insert, before the commit)."""
    code = ("import os, sqlite3, sys; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "db.execute('BEGIN IMMEDIATE'); db.execute(\"INSERT INTO rows (key, row) VALUES ('abc', '{}')\"); "
            "os._exit(3)")
    assert subprocess.run([sys.executable, "-c", code, str(path)]).returncode == 3


def test_cache_reads_lines_other_runs_append(tmp_path):
    a, b = ResultCache(tmp_path / "c.sqlite"), ResultCache(tmp_path / "c.sqlite")
    a.add([{"key": "k1", "x": 1}])
    assert "k1" not in b
    b.refresh()
    assert b["k1"] == {"key": "k1", "x": 1}


def test_knockout_variant_changes_the_outputs(tiny, tiny_data, tmp_path, pairs_file):
    cfg = _cfg(tiny_data, tmp_path, benchmarks=("mmlu", "csqa", "addsub"))
    heads = [[layer, head] for layer in range(tiny.n_layers) for head in range(tiny.n_heads)]
    variants = [Variant.make("model", "tiny"),
                Variant.make("knockout", "tiny", label="tiny - knockout", heads=heads, mlps=[1], data=str(pairs_file))]
    prepared = [prepare(v, lambda name: tiny) for v in variants]
    assert prepared[0].fingerprint != prepared[1].fingerprint and prepared[1].edits
    # the same spec gives the same fingerprint (the cache key), another spec another one
    assert prepare(variants[1], lambda name: tiny).fingerprint == prepared[1].fingerprint
    fewer = Variant.make("knockout", "tiny", heads=heads[:3], data=str(pairs_file))
    assert prepare(fewer, lambda name: tiny).fingerprint != prepared[1].fingerprint

    results = run_evaluation(variants, cfg, tmp_path / "run", loader=lambda name: tiny)
    assert [r["label"] for r in results] == ["tiny", "tiny - knockout"]
    assert results[1]["info"]["knockout"]["counterfactual_prompts"] == 4
    scores = {}
    for row in read_rows(tmp_path / "cache" / "mmlu.sqlite"):
        scores.setdefault(row["variant"], {})[row["id"]] = row["scores"]
    base, ko = scores["tiny"], scores["tiny - knockout"]
    assert base.keys() == ko.keys() and any(base[k] != ko[k] for k in base)
    outputs = {}
    for row in read_rows(tmp_path / "cache" / "addsub.sqlite"):
        outputs.setdefault(row["variant"], []).append(row["output"])
    assert outputs["tiny"] != outputs["tiny - knockout"]
    # hooks are removed after evaluation: the plain model is unchanged
    again = run_evaluation([Variant.make("model", "tiny")], _cfg(tiny_data, tmp_path / "again", benchmarks=("mmlu",)),
                     tmp_path / "again", loader=lambda name: tiny)
    assert again[0]["benchmarks"]["mmlu"]["correct"] == results[0]["benchmarks"]["mmlu"]["correct"]


def test_rows_are_built_only_for_items_not_cached_and_released_after(tiny, tiny_data, tmp_path, pairs_file,
                                                                       monkeypatch):
    means = []
    real = variants_module.compute_means
    monkeypatch.setattr(variants_module, "compute_means", lambda *a, **kw: means.append(1) or real(*a, **kw))
    cfg = _cfg(tiny_data, tmp_path, benchmarks=("mmlu",))
    knockout = Variant.make("knockout", "tiny", label="ko", heads=[[1, 0]], data=str(pairs_file))
    rows = [Variant.make("model", "tiny"), knockout]
    first = run_evaluation(rows, cfg, tmp_path / "a", loader=lambda name: tiny)
    assert len(means) == 1
    again = run_evaluation(rows, cfg, tmp_path / "b", loader=lambda name: tiny)  # every item cached: no means
    assert len(means) == 1 and again[1]["benchmarks"]["mmlu"]["timing"]["computed"] == 0
    assert [r["benchmarks"]["mmlu"]["correct"] for r in again] == [r["benchmarks"]["mmlu"]["correct"] for r in first]

    built = []
    base = prepared(tiny, label="base")
    later = Prepared(base.fingerprint + "x", "later", tiny.tokenizer, lambda: built.append(1) or (tiny, {}))
    run_evaluation([base, later], cfg, tmp_path / "c")
    assert len(built) == 1 and later._built is None and base._built is not None  # the reference stays


def test_knockout_needs_pairs_with_the_right_fields(tiny, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"reference": "1+2=", "answer": "3"}\n')
    with pytest.raises(ValueError, match="missing counterfactual"):
        prepare(Variant.make("knockout", "tiny", heads=[[0, 0]], data=str(bad)), lambda name: tiny)
    with pytest.raises(ValueError, match="--knockout-data"):
        prepare(Variant.make("knockout", "tiny", heads=[[0, 0]]), lambda name: tiny)
    with pytest.raises(ValueError, match="unknown variant kind 'distilled'; known: model, knockout, adapter"):
        prepare(Variant.make("distilled", "tiny"), lambda name: tiny)


def test_table_format():
    def result(label, accs):
        return {"label": label, "info": {"train_speed": "50 samples/s"} if label != "base" else {},
                "benchmarks": {b: {"accuracy": a, "n": 200, "correct": int(200 * a), "split": "test",
                                   "ci95": [a - 0.05, a + 0.05]} for b, a in accs.items()}}

    results = [VariantResult.from_json(result("base", {"gsm8k": 0.146, "mmlu": 0.46})),
               VariantResult.from_json(result("+ precise", {"gsm8k": 0.274, "mmlu": 0.464}))]
    md = to_markdown(results, ["gsm8k", "mmlu"]).split("\n")
    assert md[0] == "| Model | Train speed | Tuned params | GSM8K Acc. | GSM8K Δ | MMLU Acc. | MMLU Δ |"
    assert md[2] == "| base | - | - | 14.6 | - | 46.0 | - |"
    assert md[3] == "| + precise | 50 samples/s | - | 27.4 | +12.8 | 46.4 | +0.4 |"
    rows = list(csv.DictReader(io.StringIO(to_csv(results, ["gsm8k", "mmlu"]))))
    assert rows[0]["gsm8k_delta"] == "-"
    assert float(rows[1]["gsm8k_delta"]) == pytest.approx(0.274 - 0.146)
    assert float(rows[1]["mmlu_acc"]) == pytest.approx(0.464) and rows[1]["mmlu_n"] == "200"


def test_run_folder_has_table_results_and_wrong_cases(tiny, tiny_data, tmp_path):
    run_evaluation([prepared(tiny, label="tiny")], _cfg(tiny_data, tmp_path), tmp_path / "run")
    run = tmp_path / "run"
    table = (run / "table.md").read_text()
    assert table.startswith("| Model | Train speed | Tuned params | GSM8K Acc. |") and "| tiny |" in table
    results = json.loads((run / "results.json").read_text())
    for name in TABLE_BENCHMARKS:
        summary = json.loads((run / "tiny" / f"{name}.json").read_text())
        assert summary == results["variants"][0]["benchmarks"][name]
        wrong = [line for line in (run / "tiny" / f"{name}.wrong.jsonl").read_text().split("\n") if line]
        assert len(wrong) == summary["n"] - summary["correct"]
        assert summary["ci95"][0] <= summary["accuracy"] <= summary["ci95"][1]
    mmlu = results["variants"][0]["benchmarks"]["mmlu"]
    assert set(mmlu["subjects"]) == {"math", "science"}
    assert sum(s["correct"] for s in mmlu["subjects"].values()) == mmlu["correct"]


def test_generation_without_a_number_counts_as_wrong(tiny, tiny_data, tmp_path, monkeypatch):
    monkeypatch.setattr(tasks_module, "generate_stream",
                        lambda model, rows, *a, **k: ((j, ("no idea", "stop")) for j in range(len(rows))))
    res = run_evaluation([prepared(tiny, label="t")], _cfg(tiny_data, tmp_path, benchmarks=("svamp",)),
                   tmp_path / "run")[0]["benchmarks"]["svamp"]
    assert res["correct"] == 0 and res["no_number"] == res["n"] == 6
    wrong = [json.loads(x) for x in (tmp_path / "run" / "t" / "svamp.wrong.jsonl").read_text().split("\n") if x]
    assert len(wrong) == 6 and all(w["pred"] is None and w["how"] == "none" for w in wrong)


def test_bad_benchmark_and_missing_data_are_explained(tmp_path, monkeypatch):
    with pytest.raises(
        ValueError, match="unknown benchmark 'gsm9k'; known: gsm8k, addsub, singleeq, svamp, mmlu, csqa"
    ):
        check_benchmarks(["gsm8k", "gsm9k"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataNotFound, match=f"{tmp_path}/csqa/dev_rand_split.jsonl.*tau/commonsense_qa"):
        make_task("csqa", EvalSettings(), data_dir=str(tmp_path))


def test_limit_is_deterministic_and_mmlu_spreads_over_subjects(shared_data):
    cfg = EvalSettings(limit=57)
    a, b = make_task("mmlu", cfg, str(shared_data)), make_task("mmlu", cfg, str(shared_data))
    assert [i.record.id for i in a.items] == [i.record.id for i in b.items]
    assert len({i.record.subject for i in a.items}) == 57
    # each MMLU prompt is 5-shot from its own subject's dev questions
    assert all(i.prompt.count("\nAnswer: ") == 5 and i.record.subject.replace("_", " ") in i.prompt for i in a.items)
    gsm = make_task("gsm8k", EvalSettings(limit=10), str(shared_data))
    assert [i.record.id for i in gsm.items] == [str(n) for n in range(10)]


def test_heldout_evaluation_is_disjoint_from_the_training_set(shared_data):
    split = SplitSettings(seed=0, train_fraction=0.3)
    rows, manifest = build_trainset(shared_data, split)
    trained = {question_key(r["question"]) for r in rows}
    cfg = EvalSettings(split="heldout", heldout=split)
    for name in ("gsm8k", "addsub", "singleeq", "svamp"):
        task = make_task(name, cfg, str(shared_data))
        evaluated = {question_key(i.record.question) for i in task.items}
        assert evaluated and not evaluated & trained
        assert len(task.items) == manifest["evaluated"][name]["size"]
        # and the few-shot exemplars are not evaluated either
        assert not {question_key(e.question) for e in task.exemplars} & evaluated


def test_key_head_lists(tmp_path):
    assert read_heads("12.3,14.2") == [(12, 3), (14, 2)]
    (tmp_path / "a.json").write_text(json.dumps({"heads": [[12, 3], {"layer": 1, "head": 0}, "4.5"]}))
    assert read_heads(str(tmp_path / "a.json")) == [(12, 3), (1, 0), (4, 5)]
    (tmp_path / "b.csv").write_text("layer,head,score\n12,3,0.9\n14,2,0.5\n")
    assert read_heads(str(tmp_path / "b.csv")) == [(12, 3), (14, 2)]
    (tmp_path / "c.csv").write_text("12.3\n14.2\n")
    assert read_heads(str(tmp_path / "c.csv")) == [(12, 3), (14, 2)]
    with pytest.raises(FileNotFoundError, match="missing.json"):
        read_heads(str(tmp_path / "missing.json"))


def test_batches_do_not_mix_mmlu_subjects(tiny, tiny_data, tmp_path, monkeypatch):
    seen = []
    real_run = tasks_module.ChoiceTask.run

    def spy(self, model, items, prefix, cfg, batch_size):
        seen.append([it.record.subject for it in items])
        return real_run(self, model, items, prefix, cfg, batch_size)

    monkeypatch.setattr(tasks_module.ChoiceTask, "run", spy)
    run_evaluation(
        [prepared(tiny)], _cfg(tiny_data, tmp_path, benchmarks=("mmlu",), batch_size=16), tmp_path / "r"
    )
    assert sorted(map(tuple, seen)) == [("math",) * 3, ("science",) * 3]


def test_shards_split_the_work_and_the_table_comes_from_the_cache(tiny, tiny_data, tmp_path):
    cfg = dict(benchmarks=("gsm8k", "mmlu"))
    computed = {}
    for k in range(3):
        res = run_evaluation([prepared(tiny)], _cfg(tiny_data, tmp_path, shard=(k, 3), **cfg), tmp_path / "s")
        computed[k] = {b: r["timing"]["computed"] for b, r in res[0]["benchmarks"].items()}
    assert not (tmp_path / "s" / "table.md").exists()  # a shard writes no table
    counter = Counter(tiny)
    try:
        joined = run_evaluation([prepared(tiny)], _cfg(tiny_data, tmp_path, **cfg), tmp_path / "joined")
    finally:
        counter.close()
    assert counter.calls == 0  # the shards together did every item
    direct = run_evaluation([prepared(tiny)], _cfg(tiny_data, tmp_path / "direct", **cfg), tmp_path / "direct")
    for b in cfg["benchmarks"]:
        n = direct[0]["benchmarks"][b]["n"]
        assert sum(c[b] for c in computed.values()) == n  # each item in exactly one shard
        assert (joined[0]["benchmarks"][b]["correct"], joined[0]["benchmarks"][b]["n"]) == \
            (direct[0]["benchmarks"][b]["correct"], n)
    with pytest.raises(ValueError, match="0 <= K < N"):
        run_evaluation([prepared(tiny)], _cfg(tiny_data, tmp_path, shard=(2, 2), **cfg), tmp_path / "bad")

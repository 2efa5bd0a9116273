"""keyheads.stages: a stage re-runs exactly when its settings, inputs or outputs changed."""
import json

import pytest

from keyheads.stages import Runner, Stage, file_sha256


class Log(list):
    def say(self, text):
        self.append(text)


def make_plan(run, settings, calls):
    """a -> b -> c, and d reading only a's input-free sibling: a small diamond-free chain."""

    def writer(name, text):
        def go():
            calls.append(name)
            (run / name).mkdir(exist_ok=True)
            (run / name / "out.txt").write_text(text())
        return go

    read = lambda name: (run / name / "out.txt").read_text()  # noqa: E731
    return [
        Stage("a", {"n": settings["n"]}, [], ["a"], writer("a", lambda: f"a{settings['n']}")),
        Stage("b", {"k": settings["k"]}, ["a/out.txt"], ["b"], writer("b", lambda: read("a") + f"b{settings['k']}")),
        Stage("c", {}, ["b/out.txt"], ["c"], writer("c", lambda: read("b") + "c")),
        Stage("d", {"m": settings["m"]}, [], ["d"], writer("d", lambda: f"d{settings['m']}")),
    ]


def run_all(run, settings, **kw):
    calls, log = [], Log()
    runner = Runner(run, say=log.say, **kw)
    for stage in make_plan(run, settings, calls):
        runner(stage)
    return calls, log


def test_reruns_exactly_the_stages_a_change_reaches(tmp_path):
    s = {"n": 1, "k": 1, "m": 1}
    assert run_all(tmp_path, s)[0] == ["a", "b", "c", "d"]
    assert run_all(tmp_path, s)[0] == []  # up to date: nothing runs
    calls, log = run_all(tmp_path, {**s, "k": 2})
    assert calls == ["b", "c"]
    assert any("[b] running (k 1 -> 2)" in line for line in log)
    assert any("[c] running (input b/out.txt changed)" in line for line in log)
    assert (tmp_path / "c" / "out.txt").read_text() == "a1b2c"
    assert run_all(tmp_path, {**s, "k": 2, "m": 5})[0] == ["d"]
    assert run_all(tmp_path, {**s, "n": 3, "k": 2, "m": 5})[0] == ["a", "b", "c"]


def test_an_upstream_rerun_with_the_same_bytes_does_not_propagate(tmp_path):
    s = {"n": 1, "k": 1, "m": 1}
    run_all(tmp_path, s)
    assert run_all(tmp_path, s, force=True, selected={"a"})[0] == ["a"]
    assert run_all(tmp_path, s)[0] == []  # a wrote the same bytes again: b and c are still up to date


def test_record_holds_settings_hashes_versions_and_time(tmp_path):
    run_all(tmp_path, {"n": 1, "k": 1, "m": 1})
    rec = json.loads((tmp_path / "stages" / "b.json").read_text())
    assert rec["settings"] == {"k": 1}
    assert rec["inputs"] == {"a/out.txt": file_sha256(tmp_path / "a" / "out.txt")}
    assert rec["outputs"] == {"b/out.txt": file_sha256(tmp_path / "b" / "out.txt")}
    assert {"keyheads", "torch", "transformers", "python"} <= set(rec["versions"])
    assert rec["seconds"] >= 0 and rec["machine"]["cpus"] >= 1 and rec["finished"]


def test_modified_or_missing_output_reruns_the_stage(tmp_path):
    s = {"n": 1, "k": 1, "m": 1}
    run_all(tmp_path, s)
    (tmp_path / "d" / "out.txt").write_text("edited by hand")
    calls, log = run_all(tmp_path, s)
    assert calls == ["d"] and any("output(s) missing or modified: d/out.txt" in line for line in log)
    (tmp_path / "c" / "out.txt").unlink()
    assert run_all(tmp_path, s)[0] == ["c"]


def test_unselected_stale_stage_is_reported_and_left(tmp_path):
    s = {"n": 1, "k": 1, "m": 1}
    run_all(tmp_path, s)
    calls, log = run_all(tmp_path, {**s, "k": 2, "m": 2}, selected={"d"})
    assert calls == ["d"]
    assert any("[b] stale (k 1 -> 2) but not selected" in line for line in log)


def test_missing_input_of_a_selected_stage_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="stage b needs a/out.txt"):
        run_all(tmp_path, {"n": 1, "k": 1, "m": 1}, selected={"b"})


def test_interrupted_stage_resumes_with_its_signature_and_clears_otherwise(tmp_path):
    partial = tmp_path / "a" / "partial.npz"

    def crash():
        partial.parent.mkdir(exist_ok=True)
        partial.write_text("half the batches")
        raise KeyboardInterrupt

    def finish():
        assert partial.exists() == expect_partial
        partial.parent.mkdir(exist_ok=True)
        (tmp_path / "a" / "out.txt").write_text("done")

    with pytest.raises(KeyboardInterrupt):
        Runner(tmp_path, say=lambda s: None)(Stage("a", {"n": 1}, [], ["a"], crash))
    expect_partial = True  # same settings: the stage's own checkpoint is kept for it to resume
    assert Runner(tmp_path, say=lambda s: None)(Stage("a", {"n": 1}, [], ["a"], finish))
    partial.write_text("stale")
    expect_partial = False  # other settings: everything the stage owns is cleared first
    assert Runner(tmp_path, say=lambda s: None)(Stage("a", {"n": 2}, [], ["a"], finish))


def test_kept_paths_survive_clearing_and_are_not_outputs(tmp_path):
    def go():
        (tmp_path / "e").mkdir(exist_ok=True)
        (tmp_path / "e" / "table.json").write_text("t")
        (tmp_path / "e" / "cache").mkdir(exist_ok=True)
        (tmp_path / "e" / "cache" / "items.jsonl").write_text("x" * len(list((tmp_path / "e" / "cache").iterdir())))

    runner = Runner(tmp_path, say=lambda s: None)
    runner(Stage("e", {"v": 1}, [], ["e"], go, keep=["e/cache"]))
    rec = json.loads((tmp_path / "stages" / "e.json").read_text())
    assert list(rec["outputs"]) == ["e/table.json"]
    (tmp_path / "e" / "cache" / "more.jsonl").write_text("y")
    assert not runner(Stage("e", {"v": 1}, [], ["e"], go, keep=["e/cache"]))  # a cache entry is not a change
    assert runner(Stage("e", {"v": 2}, [], ["e"], go, keep=["e/cache"]))
    assert (tmp_path / "e" / "cache" / "more.jsonl").exists()


def test_per_process_resume_state_is_not_hashed_so_any_process_count_is_up_to_date(tmp_path):
    """A checkpoint per process (named by the count) is neither an output nor, downstream, an input:
    the records of N processes are those of one process, and either is up to date for the other."""
    world = {"n": 1}
    resume = ["a/ckpt*.npz"]

    def go():
        (tmp_path / "a").mkdir(exist_ok=True)
        (tmp_path / "a" / "out.txt").write_text("result")
        for r in range(world["n"]):
            (tmp_path / "a" / f"ckpt.rank{r}of{world['n']}.npz").write_text(f"part {r}")

    def plan():
        return [Stage("a", {"v": 1}, [], ["a"], go, resume=resume),
                Stage("b", {}, ["a"], ["b.txt"], lambda: (tmp_path / "b.txt").write_text("b"), resume=resume)]

    runner = Runner(tmp_path, say=lambda s: None)
    assert [runner(s) for s in plan()] == [True, True]
    records = {n: json.loads((tmp_path / "stages" / f"{n}.json").read_text()) for n in ("a", "b")}
    assert list(records["a"]["outputs"]) == ["a/out.txt"] and list(records["b"]["inputs"]) == ["a/out.txt"]
    for path in (tmp_path / "a").glob("ckpt*"):  # as two processes would have left them
        path.unlink()
    world["n"] = 2
    go()
    assert [runner(s) for s in plan()] == [False, False]
    assert runner(Stage("a", {"v": 2}, [], ["a"], go, resume=resume))  # other settings: cleared and re-run
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["ckpt.rank0of2.npz", "ckpt.rank1of2.npz",
                                                                   "out.txt"]
    # a record written before the pattern was declared listed the checkpoint among the outputs
    rec = json.loads((tmp_path / "stages" / "a.json").read_text())
    rec["outputs"]["a/ckpt.rank0of1.npz"] = "0" * 64
    (tmp_path / "stages" / "a.json").write_text(json.dumps(rec))
    assert not runner(Stage("a", {"v": 2}, [], ["a"], go, resume=resume))


def test_a_stage_record_of_another_shape_reruns_its_stage_and_says_why(tmp_path):
    s = {"n": 1, "k": 1, "m": 1}
    run_all(tmp_path, s)
    record = tmp_path / "stages" / "b.json"
    data = json.loads(record.read_text())
    del data["outputs"]  # a damaged record, or another release's: it cannot vouch for b's outputs
    record.write_text(json.dumps(data))
    calls, log = run_all(tmp_path, s)
    assert calls == ["b"]  # c's input came back with the same bytes
    assert any("[b] running (its record b.json is not one this version reads" in line for line in log)

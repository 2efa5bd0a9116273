"""The three commands end to end on a tiny model: files written, warnings and errors said."""
import json

import numpy as np
import pytest

from keyheads.cli import main

from tests.helpers import make_rows, write_effects, write_rows


@pytest.fixture
def run(monkeypatch, llama):
    monkeypatch.setattr("keyheads.commands.analysis.load_from_args", lambda args: llama)
    return main


@pytest.fixture
def effects(tmp_path):
    heads = -np.arange(12).reshape(3, 4) / 100.0  # most negative: 2.3, 2.2, ...
    return write_effects(tmp_path / "effects.json", heads.tolist())


def test_knockout_command(run, tmp_path, pairs_file, effects, shared_data, capsys):
    other = write_rows(tmp_path / "other.jsonl", make_rows(8, seed=1, ops=(("multiplication", "*", "@"),)))
    out = tmp_path / "ko"
    rc = run(["knockout", "--data", str(pairs_file), "--effects", str(effects), "--out", str(out), "--top-k", "3",
              "-k", "99", "--seeds", "2", "--limit", "null", "--transfer-data", str(other), "--transfer-n", "2",
              "--data-dir", str(shared_data), "--quiet"])
    assert rc == 0
    res = json.loads((out / "knockout.json").read_text())
    assert res["curves"]["k"] == list(range(13))  # capped at 3 x 4 heads
    assert res["curves"]["effect_order"][:3] == [
        {"layer": 2, "head": 3},
        {"layer": 2, "head": 2},
        {"layer": 2, "head": 1},
    ]
    assert any("capped" in n for n in res["notes"])
    assert res["key_heads"]["heads"] == [{"layer": 2, "head": 3}, {"layer": 2, "head": 2}, {"layer": 2, "head": 1}]
    control = res["transfer"]["random_heads"]
    assert len(control) == 3 and not {tuple(h.values()) for h in control} & {
        tuple(h.values()) for h in res["key_heads"]["heads"]
    }
    assert all(r["accuracy_random_heads"] is not None for r in res["transfer"]["rows"])
    names = [r["set"] for r in res["transfer"]["rows"]]
    assert any("multiplication" in n for n in names) and any("SVAMP" in n for n in names)
    assert any("GSM8K" in n for n in names) and any("decimal" in n for n in names)
    for f in ("knockout_curves.png", "knockout_curves.csv", "transfer.csv", "transfer_cases.txt"):
        assert (out / f).stat().st_size > 0
    printed = capsys.readouterr()
    assert "Top-5 prediction probability" in printed.out and "fallback" in printed.err


def test_knockout_of_given_heads_without_effects(run, tmp_path, pairs_file):
    out = tmp_path / "ko"
    assert run(["knockout", "--data", str(pairs_file), "--heads", "0.1,2.2", "--out", str(out), "--no-transfer",
                "--quiet"]) == 0
    res = json.loads((out / "knockout.json").read_text())
    assert res["key_heads"]["heads"] == [{"layer": 0, "head": 1}, {"layer": 2, "head": 2}] and "curves" not in res


def test_empty_key_heads_is_an_error_naming_the_threshold(run, tmp_path, pairs_file, effects, capsys):
    rc = run(["knockout", "--data", str(pairs_file), "--effects", str(effects), "--threshold", "-0.5",
              "--out", str(tmp_path / "x"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "-0.5" in err and "--top-k" in err


def test_attention_and_mlp_commands(run, tmp_path, pairs_file, effects, capsys):
    out = tmp_path / "att"
    assert run(["attention", "--data", str(pairs_file), "--effects", str(effects), "--top-k", "4", "--out", str(out),
                "--quiet"]) == 0
    res = json.loads((out / "attention.json").read_text())
    assert set(res["per_task"]) == {"addition", "subtraction"} and len(res["labels"]) == 4
    assert {l["label"] for l in res["labels"]} <= {"operand", "operator", "text"}
    for f in ("attention_by_role.png", "attention_cases.png", "attention_transfer_cases.png", "attention_by_role.csv"):
        assert (out / f).stat().st_size > 0
    out = tmp_path / "mlp"
    assert run(["mlp", "--data", str(pairs_file), "--out", str(out), "--quiet"]) == 0
    res = json.loads((out / "mlp.json").read_text())
    assert len(res["curves"]["in_A"]) == 3 and res["case"]["prompt"].endswith("4 + 3 = ")
    assert set(res["turning_points"]) == {"start", "inflection", "end"}
    assert 0 < len(res["answer_specific"]) <= res["n_samples"] and {len(row) for row in res["answer_specific"]} == {3}
    assert "start-inflection-end" in capsys.readouterr().out
    for f in ("mlp_input_operands.png", "mlp_output_answer.png", "mlp_case.png", "mlp_curves.csv"):
        assert (out / f).stat().st_size > 0


def test_the_answer_specific_write_has_one_row_per_distinct_prompt(run, tmp_path, pairs_file):
    """Each pair written twice: twice the samples, the same rows of answer_specific (a repeated prompt is one
    observation of the verdict's bootstrap, not two)."""
    twice = tmp_path / "twice.jsonl"
    twice.write_text(pairs_file.read_text() * 2)
    found = {}
    for name, data in (("once", pairs_file), ("twice", twice)):
        assert run(["mlp", "--data", str(data), "--out", str(tmp_path / name), "--limit", "1000", "--quiet"]) == 0
        found[name] = json.loads((tmp_path / name / "mlp.json").read_text())
    assert found["twice"]["n_samples"] == 2 * found["once"]["n_samples"]
    once, both = np.asarray(found["once"]["answer_specific"]), np.asarray(found["twice"]["answer_specific"])
    assert once.shape == both.shape and len(once) > 0
    np.testing.assert_allclose(both, once, atol=1e-6)


def test_attention_without_positions_says_so(run, tmp_path, effects, capsys):
    rows = [{k: v for k, v in r.items() if k in ("reference", "counterfactual", "answer")} for r in make_rows(4)]
    bare = write_rows(tmp_path / "bare.jsonl", rows)
    rc = run(["attention", "--data", str(bare), "--effects", str(effects), "--top-k", "2", "--out",
              str(tmp_path / "a"), "--quiet"])
    assert rc == 2 and "positions" in capsys.readouterr().err


def test_a_truncated_effects_file_is_named_before_the_model_loads(run, tmp_path, pairs_file, effects, capsys,
                                                                   monkeypatch):
    import keyheads.commands.analysis as command

    monkeypatch.setattr(command, "load_from_args", lambda cfg: pytest.fail("the model loaded before the check"))
    broken = tmp_path / "effects.json"
    broken.write_text(effects.read_text()[:40])
    rc = run(["knockout", "--data", str(pairs_file), "--effects", str(broken), "--out", str(tmp_path / "x"),
              "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{broken} is not valid JSON" in err and "Traceback" not in err


def test_a_command_records_its_work_time_without_the_load(monkeypatch, llama, tmp_path, pairs_file, capsys):
    """Quiet or not, the command prints its work time and writes it to OUT/timing.json; the load is not in it."""
    import time

    def slow_load(args):
        time.sleep(1.0)
        return llama

    monkeypatch.setattr("keyheads.commands.analysis.load_from_args", slow_load)
    out = tmp_path / "ko"
    start = time.perf_counter()
    assert main(["knockout", "--data", str(pairs_file), "--heads", "0.1,2.2", "--out", str(out), "--no-transfer",
                 "--quiet"]) == 0
    total = time.perf_counter() - start
    timing = json.loads((out / "timing.json").read_text())
    assert timing["command"] == "knockout" and 0 < timing["seconds"] < total - 0.9
    assert f"knockout: {timing['seconds']:.1f} s of work (model load excluded)" in capsys.readouterr().out
    assert "seconds" not in (out / "knockout.json").read_text()  # the result itself stays the same bytes

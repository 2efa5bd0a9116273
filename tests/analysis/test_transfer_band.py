"""studies/transfer_band.py re-measures the knockout stage's transfer table: with the same settings, its seed-0
draw is the stage's control and its accuracies are the stage's; the other seeds are other draws; a finished
run resumes without a pass."""
import argparse
import importlib
import json
from pathlib import Path

import pytest

from keyheads.cli import main

from tests.helpers import make_rows, write_rows

pytestmark = pytest.mark.slow  # a knockout stage and its re-measure, about 10 s

STUDIES = Path(__file__).resolve().parents[2] / "studies"


@pytest.fixture
def band(monkeypatch):
    monkeypatch.syspath_prepend(str(STUDIES))
    return importlib.import_module("transfer_band")


def test_seed_zero_is_the_knockout_stages_control_and_other_seeds_are_other_draws(band, monkeypatch, llama, tmp_path,
                                                                                  pairs_file, shared_data):
    other = write_rows(tmp_path / "other.jsonl", make_rows(8, seed=1, ops=(("multiplication", "*", "@"),)))
    monkeypatch.setattr("keyheads.commands.analysis.load_from_args", lambda args: llama)
    out = tmp_path / "ko"
    assert main(["knockout", "--data", str(pairs_file), "--heads", "2.3,1.0,0.2", "--out", str(out), "--limit",
                 "null", "--transfer-data", str(other), "--transfer-n", "3", "--data-dir", str(shared_data),
                 "--quiet"]) == 0
    stage = json.loads((out / "knockout.json").read_text())["transfer"]
    args = argparse.Namespace(data=str(pairs_file), heads="2.3,1.0,0.2", transfer_data=str(other), transfer_by="task",
                              transfer_n=3, limit=None, mean="aligned", seed=0, seeds=3,
                              data_dir=str(shared_data), batch_size=32, work=str(tmp_path / "work"))
    rows, draws, _ = band.measure(llama, args)

    assert [str(h) for h in draws[0]] == [f"{h['layer']}.{h['head']}" for h in stage["random_heads"]]
    assert len({tuple(map(str, d)) for d in draws}) == 3
    assert all(not {str(h) for h in d} & {"2.3", "1.0", "0.2"} for d in draws)
    assert [r["set"] for r in rows] == [r["set"] for r in stage["rows"]]
    for mine, theirs in zip(rows, stage["rows"]):
        assert mine["n"] == theirs["n"]
        assert mine["before"] == pytest.approx(theirs["accuracy_before"])
        assert mine["key"] == pytest.approx(theirs["accuracy_after"])
        assert mine["draws"][0] == pytest.approx(theirs["accuracy_random_heads"])

    table = band.table(rows, 3).splitlines()
    assert len(table) == 2 + len(rows) and table[0].count("random seed") == 3

    # finished: a second call reads every set back and runs no pass
    monkeypatch.setattr(band, "EndPasses", lambda *a, **k: pytest.fail("a finished set was measured again"))
    again, _, _ = band.measure(llama, args)
    assert again == rows


def test_bad_heads_are_refused_before_the_model_loads(band, tmp_path, monkeypatch, capsys):
    """A usage error (exit 2) that says what is wrong; the model named does not exist, so loading it first would
    end in another error."""
    cases = [("14.x", "is not of the form LAYER.HEAD"), ("1.0,1.0", "listed twice"), (" ,", "names no head")]
    for heads, said in cases:
        monkeypatch.setattr("sys.argv", ["transfer_band.py", "--model", "no-such-model", "--data", "x.jsonl",
                                         "--heads", heads, "--work", str(tmp_path)])
        with pytest.raises(SystemExit) as exit_:
            band.main()
        assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_heads_outside_the_model_and_an_unreadable_partial_file(band, llama, tmp_path, pairs_file, shared_data, capsys):
    from keyheads.errors import UserError
    args = argparse.Namespace(data=str(pairs_file), heads="2.3,9.0", transfer_data=None, transfer_by="task",
                              transfer_n=3, limit=None, mean="aligned", seed=0, seeds=2,
                              data_dir=str(shared_data), batch_size=32, work=str(tmp_path / "work"))
    with pytest.raises(UserError, match="head 9.0 does not exist"):
        band.measure(llama, args)

    args.heads = "2.3,1.0"
    rows, _, _ = band.measure(llama, args)
    assert rows
    partial = tmp_path / "work" / "rows.partial.json"
    stamp = json.loads(partial.read_text())["stamp"]
    for broken in ('{"stamp": "trunc', "[]", json.dumps({"stamp": stamp, "rows": [{"set": "x"}]})):  # edited by hand
        partial.write_text(broken)
        again, _, _ = band.measure(llama, args)
        assert again == rows
    assert capsys.readouterr().err.count("measuring every set again") == 3

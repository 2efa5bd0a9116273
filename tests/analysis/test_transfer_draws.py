"""The knockout stage's transfer control is a band of random draws: `transfer_draws` draws of as many non-key
heads as the key heads, by seeds seed, seed+1, ... (the first is the one draw earlier releases made); each set's
row holds every draw's accuracy, measured as a knockout of that draw alone, and their mean."""
import json

import pytest

from keyheads.analysis import transfer as tr
from keyheads.analysis.common import knockout_subset, load_samples
from keyheads.analysis.knockout_run import control_heads
from keyheads.cli import main
from keyheads.heads import Head
from keyheads.knockout import compute_means

from tests.helpers import make_rows, write_rows

pytestmark = pytest.mark.slow  # a knockout stage and its direct re-measure, about 10 s
KEY = "2.3,1.0,0.2"


def test_the_stage_draws_the_control_three_times_and_each_draw_is_its_own_knockout(monkeypatch, llama, tmp_path,
                                                                                   pairs_file):
    other = write_rows(tmp_path / "other.jsonl", make_rows(8, seed=1, ops=(("multiplication", "*", "@"),)))
    monkeypatch.setattr("keyheads.commands.analysis.load_from_args", lambda args: llama)
    out = tmp_path / "ko"
    assert main(["knockout", "--data", str(pairs_file), "--heads", KEY, "--out", str(out), "--limit", "null",
                 "--transfer-data", str(other), "--transfer-n", "3", "--quiet"]) == 0
    data = json.loads((out / "knockout.json").read_text())["transfer"]
    key = [Head.parse(h) for h in KEY.split(",")]
    draws = [[Head(h["layer"], h["head"]) for h in d] for d in data["random_draws"]]
    assert draws == [control_heads(llama, key, seed) for seed in (0, 1, 2)]  # the stage's rule, seeds 0, 1, 2
    assert len({tuple(d) for d in draws}) == 3 and all(not set(d) & set(key) for d in draws)
    assert [Head(h["layer"], h["head"]) for h in data["random_heads"]] == draws[0]

    # the identification row re-measured directly, one draw at a time: the same accuracies, and their mean
    samples = load_samples(llama, pairs_file)
    tset = tr.TransferSet("ident", [x.prompt for x in samples], [x.answer for x in samples],
                          [x.answer_id for x in samples])
    cfs = [json.loads(x)["counterfactual"] for x in pairs_file.read_text().splitlines()]
    full = compute_means(llama, cfs, heads=sorted({h for d in draws for h in d} | set(key)), mean=data_mean(out),
                         progress=False)
    direct = [tr.evaluate(llama, tset, knockout_subset(full, key), progress=False,
                          controls=[knockout_subset(full, d)])[0].accuracy_random_heads for d in draws]
    first = data["rows"][0]
    assert first["accuracy_random_draws"] == pytest.approx(direct)
    assert first["accuracy_random_heads"] == pytest.approx(sum(direct) / 3)


def test_an_earlier_release_s_single_draw_still_reads_as_one_draw():
    from keyheads.results.knockout import TransferRow

    old = TransferRow.from_json({"set": "s", "n": 10, "accuracy_before": 0.8, "accuracy_after": 0.2,
                                 "relative_change": -0.75, "accuracy_random_heads": 0.7,
                                 "relative_change_random_heads": -0.125})
    assert old.random_draws() == [0.7]


def data_mean(out):
    """The knockout mean the stage used."""
    return json.loads((out / "knockout.json").read_text())["mean"]


def test_a_stopped_transfer_table_resumes_after_its_finished_sets(monkeypatch, llama, tmp_path, pairs_file):
    """Each transfer set's row is kept as it finishes: a knockout stopped in its third set computes only the sets
    it had not finished when run again, and writes the same table as a run never stopped."""
    import keyheads.analysis.knockout_run as kr
    from keyheads.io import read_json

    from tests.helpers import Killed

    monkeypatch.setattr("keyheads.commands.analysis.load_from_args", lambda args: llama)
    args = ["knockout", "--data", str(pairs_file), "--heads", KEY, "--limit", "null", "--transfer-n", "3", "--quiet"]
    assert main(args + ["--out", str(tmp_path / "whole")]) == 0
    want = json.loads((tmp_path / "whole" / "knockout.json").read_text())["transfer"]
    real, calls = tr.evaluate, []

    def stopped_in_the_third_set(*a, **k):
        calls.append(a[1].name)
        if len(calls) == 3:
            raise Killed
        return real(*a, **k)

    out = tmp_path / "stopped"
    monkeypatch.setattr(tr, "evaluate", stopped_in_the_third_set)
    with pytest.raises(Killed):
        main(args + ["--out", str(out)])
    assert len(read_json(out / kr.TRANSFER_PARTIAL)["results"]) == 2
    calls.clear()
    monkeypatch.setattr(tr, "evaluate", lambda *a, **k: calls.append(a[1].name) or real(*a, **k))
    assert main(args + ["--out", str(out)]) == 0
    assert len(calls) == len(want["rows"]) - 2 and calls[0] not in [r["set"] for r in want["rows"][:2]]
    assert json.loads((out / "knockout.json").read_text())["transfer"] == want
    assert not (out / kr.TRANSFER_PARTIAL).exists()
    calls.clear()  # a checkpoint made with other key heads is not read
    monkeypatch.setattr(tr, "evaluate", stopped_in_the_third_set)
    with pytest.raises(Killed):
        main(args + ["--out", str(out)])
    calls.clear()
    monkeypatch.setattr(tr, "evaluate", lambda *a, **k: calls.append(a[1].name) or real(*a, **k))
    assert main(args[:4] + ["2.3,1.0"] + args[5:] + ["--out", str(out)]) == 0
    assert len(calls) == len(want["rows"])

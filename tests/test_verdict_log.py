"""Rules fixed before data: every committed record's verdicts are logged under the rules' version
(studies/verdicts.json), a verdict that moves needs a new rules version, and the change log names each move and the
rule change behind it (studies/verdict_changes.json, rendered in studies/RESULTS.md by studies/pages.py)."""
import json
from pathlib import Path

from keyheads.report.rules import RULE, RULES_VERSION
from studies import rejudge

ROOT = Path(__file__).resolve().parents[1]


def test_the_logged_verdicts_are_what_the_rules_give_now():
    logged = json.loads(rejudge.VERDICTS.read_text())
    assert logged["rules_version"] == RULES_VERSION, "run python -m studies.rejudge"
    assert logged["studies"] == rejudge.judged(json.loads((ROOT / "studies" / "studies.json").read_text())), \
        "a verdict moved: raise RULES_VERSION with the rule's reason, then run python -m studies.rejudge"


def test_the_change_log_ends_at_this_version_and_each_move_is_current():
    log = json.loads(rejudge.CHANGES.read_text())["changes"]
    assert log and log[-1]["rules_version"] == RULES_VERSION
    now = json.loads(rejudge.VERDICTS.read_text())["studies"]
    for move in log[-1]["moved"]:
        assert now[move["study"]]["verdicts"][str(move["row"])] == move["to"], move
        assert move["why"] == RULE[move["row"]].changes.get(RULES_VERSION, move["why"])


def _setup(tmp_path, monkeypatch, version: int) -> dict:
    """A logged snapshot of the records, one verdict altered, under rules `version`."""
    monkeypatch.setattr(rejudge, "VERDICTS", tmp_path / "verdicts.json")
    monkeypatch.setattr(rejudge, "CHANGES", tmp_path / "verdict_changes.json")
    now = json.loads((ROOT / "studies" / "verdicts.json").read_text())["studies"]
    name = next(iter(now))
    now[name]["verdicts"]["1"] = "partly" if now[name]["verdicts"]["1"] != "partly" else "holds"
    (tmp_path / "verdicts.json").write_text(json.dumps({"rules_version": version, "studies": now}))
    return {"study": name, "was": now[name]["verdicts"]["1"]}


def test_a_verdict_that_moves_under_the_same_rules_version_is_refused(tmp_path, monkeypatch, capsys):
    _setup(tmp_path, monkeypatch, RULES_VERSION)
    assert rejudge.main([]) == 1
    assert "Raise RULES_VERSION" in capsys.readouterr().err
    assert rejudge.main(["--check"]) == 1


def test_a_new_rules_version_logs_each_moved_verdict_with_its_rule_s_reason(tmp_path, monkeypatch):
    altered = _setup(tmp_path, monkeypatch, RULES_VERSION - 1)
    assert rejudge.main([]) == 0
    [entry] = json.loads((tmp_path / "verdict_changes.json").read_text())["changes"]
    [move] = [m for m in entry["moved"] if m["study"] == altered["study"] and m["row"] == 1]
    assert move["from"] == altered["was"] and entry["rules_version"] == RULES_VERSION
    assert move["why"] == RULE[1].changes.get(RULES_VERSION, "this rule did not change: a rule it reads did")
    assert rejudge.main(["--check"]) == 0

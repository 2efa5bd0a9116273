"""Every command's --help reads as a person would write it: metavars that say what a value is, each
default once and as its real value, lines that fit the terminal; and the one-letter settings take
their long spellings (--n, --k) too."""
from __future__ import annotations

import argparse
import re

import pytest

from keyheads.cli import build_parser, main
from keyheads.commands.flags import settings


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


COMMANDS = sorted(_commands())


def _help(command: str, monkeypatch, capsys, columns: int = 80) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def _entries(text: str) -> dict[str, str]:
    """Each option's help entry (its invocation and help, joined over wrapped lines), by invocation."""
    entries: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if re.match(r"  -", line):
            current = line.strip()
            entries[current] = line.strip()
        elif current and line.startswith("   ") and line.strip():
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


def test_every_command_is_covered():
    assert {"run", "demo", "knockout", "finetune", "data", "eval", "plan", "generate"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_metavars_say_what_a_value_is(command, monkeypatch, capsys):
    text = _help(command, monkeypatch, capsys)
    # a type's name where a value goes: `--top-k int`, `[--device str]`, `--adapter list[str]`
    python_types = re.findall(r"(?<![\w-])--?[a-z][\w.\-\[\]]* (?:str|int|float|bool)\b", text)
    assert not python_types, python_types
    assert not re.search(r"\b(?:list|tuple|dict|set)\[", text)
    for action in _commands()[command]._actions:
        assert action.metavar not in ("str", "int", "float", "bool", "Any"), (command, action.option_strings)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_default_is_shown_once_as_its_value(command, monkeypatch, capsys):
    text = _help(command, monkeypatch, capsys)
    for wrong in ("(default: null)", "(default: None)", "default factory", "(default: False)", "(default: True)",
                  "(default: [])", "(default: ())"):
        assert wrong not in text, wrong
    for entry in _entries(text).values():
        assert entry.count("(default:") <= 1, entry
        assert not re.search(r"default[: ]+[^)]*\)\s*\(default:", entry), entry  # stated, then stated again
        assert not re.search(r"\bNone\b", entry), entry  # the value a flag or YAML takes is null


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_80_columns(command, monkeypatch, capsys):
    text = _help(command, monkeypatch, capsys, columns=80)
    long = [line for line in text.splitlines() if len(line) > 80]
    assert not long, long


def test_top_level_help_fits_80_columns(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["--help"])
    assert all(len(line) <= 80 for line in capsys.readouterr().out.splitlines())


def test_metavars_and_defaults_read_as_meant(monkeypatch, capsys):
    knockout = _entries(_help("knockout", monkeypatch, capsys))
    starts = {k.split()[0].rstrip(","): k for k in knockout}
    assert "--device DEVICE" in starts["--device"] and "--dtype DTYPE" in starts["--dtype"]
    assert starts["--top-k"].startswith("--top-k N") and starts["--data"].startswith("--data FILE")
    assert starts["--out"].startswith("--out DIR") and starts["--heads"].startswith("--heads HEADS")
    assert starts["-k"].startswith("-k, --k N")
    assert "(default: on)" in knockout[starts["--[no-]transfer"]]
    assert "(default: off)" in knockout[starts["--[no-]quiet"]]
    assert knockout[starts["--out"]].endswith("(required)")
    assert "(default: smollm2-135m)" in knockout[starts["--model"]]

    finetune = _entries(_help("finetune", monkeypatch, capsys))
    starts = {k.split()[0].rstrip(","): k for k in finetune}
    assert starts["--lr"].startswith("--lr LR") and "(default: 2e-5)" in finetune[starts["--lr"]]
    assert starts["--adam-betas"].startswith("--adam-betas BETA1,BETA2")
    assert "(default: 0.9,0.999)" in finetune[starts["--adam-betas"]]
    assert "(default:" not in finetune[starts["--max-grad-norm"]]  # the description says it: "Trainer default 1.0"

    evaluation = _entries(_help("eval", monkeypatch, capsys))
    starts = {k.split()[0].rstrip(","): k for k in evaluation}
    assert starts["--benchmarks"].startswith("--benchmarks NAME[,NAME...]")
    assert "(default: gsm8k,addsub,singleeq,svamp,mmlu,csqa)" in evaluation[starts["--benchmarks"]]
    assert starts["--adapter"].startswith("--adapter DIR[,DIR...]")
    assert starts["--variant"].startswith("--variant JSON")
    assert "null: all" in evaluation[starts["--limit"]]

    data = _entries(_help("data", monkeypatch, capsys))
    starts = {k.split()[0].rstrip(","): k for k in data}
    assert starts["--out"].startswith("--out FILE")  # a file here, a folder everywhere else
    assert starts["--template-files"].startswith("--template-files FILE[,FILE...]")


def test_descriptions_name_settings_as_flags(monkeypatch, capsys):
    knockout = _help("knockout", monkeypatch, capsys)
    assert "unless --top-k is given" in knockout and "top_k" not in knockout
    run = " ".join(_help("run", monkeypatch, capsys).split())
    assert "unless --identify.top-k is given" in run and "--finetune.micro-batch-size" in run
    assert "draw the few-shot examples" in run  # prose, not a flag


def test_run_shows_the_defaults_of_its_sections_which_are_the_commands(monkeypatch, capsys):
    entries = _entries(_help("run", monkeypatch, capsys))
    starts = {k.split()[0]: k for k in entries}
    data = _entries(_help("data", monkeypatch, capsys))
    [n] = [k for k in data if k.startswith("-n, --n N")]
    assert starts["--data.n"].startswith("--data.n N") and "(default: 100)" in entries[starts["--data.n"]]
    assert "(default: 100)" in data[n]  # one default, the command's and the run's
    assert "(default: 1000)" in entries[starts["--attention.limit"]]
    assert starts["--finetune.lr"].startswith("--finetune.lr LR")
    assert "(default: on)" in entries[starts["--[no-]knockout.transfer-control"]]


@pytest.mark.parametrize("flag", ["-n", "--n"])
def test_data_takes_n_in_both_spellings(flag, tmp_path):
    args = build_parser().parse_args(["data", "--out", str(tmp_path / "pairs.jsonl"), flag, "7"])
    assert settings(args).n == 7


@pytest.mark.parametrize("flag", ["-k", "--k"])
def test_knockout_takes_k_in_both_spellings(flag, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"reference": "1 + 2 = ", "counterfactual": "1 @ 2 = ", "answer": "3"}\n')
    args = build_parser().parse_args(["knockout", "--data", str(pairs), "--out", str(tmp_path / "run"), flag, "5"])
    assert settings(args).k == 5


def test_run_keeps_both_boolean_spellings():
    parser = build_parser()
    assert parser.parse_args(["demo", "--no-data.shared-prefix"]).__dict__["data.shared_prefix"] is False
    assert parser.parse_args(["demo", "--data.shared-prefix"]).__dict__["data.shared_prefix"] is True

"""`keyheads data` end to end on a tiny model saved as a local folder."""
import pytest

from keyheads.cli import main
from keyheads.data.pairs import read_pairs, verify_pair
from keyheads.data.templates import TASKS
from keyheads.testing import tiny_model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    model = tiny_model("llama")
    model.hf.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    return folder


def test_cli_writes_aligned_pairs_for_all_tasks(tiny_folder, tmp_path, capsys):
    out = tmp_path / "pairs.jsonl"
    args = ["data", "--model", str(tiny_folder), "--task", "all", "-n", "12", "--few-shot", "1",
            "--seed", "4", "--out", str(out)]
    assert main(args) == 0
    pairs = read_pairs(out)
    assert [sum(p.task == t for p in pairs) for t in TASKS] == [12] * len(TASKS)
    tok = tiny_model("llama").tokenizer
    assert all(verify_pair(tok, p) == [] for p in pairs)
    assert f"wrote {12 * len(TASKS)} pairs" in capsys.readouterr().out
    first = out.read_text()
    assert main(args) == 0 and out.read_text() == first  # deterministic given --seed


def test_cli_template_selection_and_operands(tiny_folder, tmp_path):
    out = tmp_path / "sel.jsonl"
    assert main(["data", "--model", str(tiny_folder), "--task", "all", "-n", "6", "--out", str(out),
                 "--templates", "add-eq-1,sub-qa-2", "--a-range", "2,4", "--b-range", "2,4"]) == 0
    pairs = read_pairs(out)
    assert {p.template for p in pairs} == {"add-eq-1", "sub-qa-2"} and len(pairs) == 12
    assert all(2 <= int(v) <= 4 for p in pairs for v in p.operands.values())


def test_cli_bad_inputs_are_explained(tiny_folder, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text('templates:\n  - {id: my-add, task: addition, text: "{A} plus {B} = {C}"}\n')
    out = tmp_path / "x.jsonl"
    base = ["data", "--model", str(tiny_folder), "-n", "3", "--out", str(out)]
    assert main(base + ["--template-files", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "my-add" in err and "{OP}" in err
    assert main(base + ["--templates", "add-nope-1"]) == 2
    assert "add-nope-1" in capsys.readouterr().err
    assert main(base + ["--a-range", "9,1"]) == 2
    assert "--a-range [9, 1]: needs 0 <= LO <= HI" in capsys.readouterr().err
    assert not out.exists()

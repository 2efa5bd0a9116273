"""The identify stage has one name: `keyheads identify` and a run's `identify:` section. `keyheads patch`, its old
name, still runs for one release and says it is renamed; an old config's `patch:` is told the new key and the
converter; the converter renames it in a YAML config."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from keyheads.cli import main
from keyheads.config.run import RunSettings
from keyheads.errors import UserError
from keyheads.testing import tiny_model

from tests.helpers import make_rows, write_rows

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "upgrade_run_folder.py"


@pytest.fixture(scope="module")
def model_and_pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("identify")
    model = tiny_model("llama", seed=0)
    model.hf.save_pretrained(root / "model")
    model.tokenizer.save_pretrained(root / "model")
    return root / "model", write_rows(root / "pairs.jsonl", make_rows(6))


def test_the_old_name_runs_the_same_command_and_says_it_is_renamed(model_and_pairs, tmp_path, capsys):
    model, pairs = model_and_pairs
    common = ["--model", str(model), "--data", str(pairs), "--top-k", "2", "--batch-size", "4", "--quiet"]
    assert main(["identify", *common, "--out", str(tmp_path / "new" / "identify")]) == 0
    assert "renamed" not in capsys.readouterr().err
    assert main(["patch", *common, "--out", str(tmp_path / "old")]) == 0
    assert "keyheads patch is renamed `keyheads identify`" in capsys.readouterr().err
    new, old = (json.loads(p.read_text()) for p in (tmp_path / "new" / "identify" / "effects.json",
                                                    tmp_path / "old" / "effects.json"))
    assert new["heads"] == old["heads"] and new["mlps"] == old["mlps"]


def test_an_old_patch_section_is_told_its_new_name(tmp_path):
    config = tmp_path / "old.yaml"
    text = "# a comment kept\nmodel: smollm2-135m\neval: {benchmarks: [arith-add]}\n"
    config.write_text(text + "patch:\n  top_k: 4  # four heads\n")
    with pytest.raises(UserError, match=r"patch.*unknown setting; it is now identify: .*upgrade_run_folder"):
        RunSettings.from_yaml(config)
    done = subprocess.run([sys.executable, str(TOOL), str(config)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert config.read_text() == text + "identify:\n  top_k: 4  # four heads\n"
    assert RunSettings.from_yaml(config).identify.top_k == 4

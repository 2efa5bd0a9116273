"""The knockout mean is one type with one name: settings, flags and records say `mean`; records written under a
former name are read through the one converter, and the module imports without torch."""
import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from keyheads.analysis.settings import KnockoutSettings
from keyheads.mean import DEFAULT_MEAN, MEANS, run_mean, upgraded
from keyheads.runfolder import RunFolder


def test_the_mean_module_imports_without_torch():
    code = "import sys, keyheads.mean; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"


def test_settings_take_the_mean_by_its_one_name():
    assert MEANS == ("aligned", "global") and DEFAULT_MEAN == "aligned"
    assert KnockoutSettings().mean == "aligned" and KnockoutSettings(mean="global").mean == "global"
    with pytest.raises(ValidationError):
        KnockoutSettings(mean="median")


def test_old_records_are_read_through_the_converter(tmp_path):
    old = {"mean_mode": "global", "n_samples": 3, "config": {"mean_mode": "global", "k": 4}}
    assert upgraded(old) == {"mean": "global", "n_samples": 3, "config": {"mean": "global", "k": 4}}
    assert upgraded({"mean": "aligned"}) == {"mean": "aligned"} and upgraded(None) is None
    folder = tmp_path / "run"
    (folder / "knockout").mkdir(parents=True)
    (folder / "knockout" / "knockout.json").write_text(json.dumps(old))
    assert RunFolder(folder).knockout_record["mean"] == "global"


def test_a_run_has_one_mean():
    assert run_mean({"knockout": {"mean": "global"}, "eval": {}}) == "global"
    assert run_mean({"knockout": {}, "eval": {"knockout_mean": "global"}}) == "global"  # a run from before
    assert run_mean({}) == DEFAULT_MEAN


@pytest.mark.parametrize("section, key", [("knockout", "mean_mode"), ("eval", "knockout_mean")])
def test_a_config_with_a_former_name_is_told_the_new_one(tmp_path, capsys, section, key):
    from keyheads.cli import main

    config = tmp_path / "old.yaml"
    config.write_text(f"model: smollm2-135m\n{section}:\n  {key}: global\n")
    assert main(["run", str(config), "--out", str(tmp_path / "run")]) == 2
    assert f"{section}.{key}: 'global' given; unknown setting; it is now knockout.mean" in capsys.readouterr().err

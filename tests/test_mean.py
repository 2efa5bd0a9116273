"""The knockout mean is one type with one name: settings, flags and records say `mean`, and the module imports
without torch. (Run folders saved under former names convert with tools/upgrade_run_folder.py:
tests/test_upgrade_run_folder.py.)"""
import subprocess
import sys

import pytest
from pydantic import ValidationError

from keyheads.analysis.settings import KnockoutSettings
from keyheads.mean import DEFAULT_MEAN, MEANS
from keyheads.results.run import SavedConfig


def test_the_mean_module_imports_without_torch():
    code = "import sys, keyheads.mean; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"


def test_settings_take_the_mean_by_its_one_name():
    assert MEANS == ("aligned", "global") and DEFAULT_MEAN == "aligned"
    assert KnockoutSettings().mean == "aligned" and KnockoutSettings(mean="global").mean == "global"
    with pytest.raises(ValidationError):
        KnockoutSettings(mean="median")


def test_a_run_has_one_mean():
    assert SavedConfig.from_json({"knockout": {"mean": "global"}, "eval": {}}).knockout_mean == "global"
    assert SavedConfig.from_json({}).knockout_mean == DEFAULT_MEAN
    assert SavedConfig.from_json({"knockout": {"k": 8}}).knockout_mean == DEFAULT_MEAN

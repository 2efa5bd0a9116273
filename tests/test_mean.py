"""The knockout mean is one type with one name: settings, flags and records say `mean`; records written under a
former name are read through the one converter, and the module imports without torch."""
import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from keyheads.analysis.settings import KnockoutSettings
from keyheads.heads import Head
from keyheads.mean import DEFAULT_MEAN, MEANS, run_mean, upgraded
from keyheads.results.knockout import HeadsKnockout, KnockoutResult
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
    # knockout.json as it was saved under the former name, read by the run folder's typed reader
    now = KnockoutResult(model="m", data="pairs.jsonl", n_samples=3, n_counterfactual=3, mean="global", effects=None,
                         config={"mean": "global", "k": 4}, notes=[],
                         key_heads=HeadsKnockout(heads=[Head(0, 1)], accuracy_before=0.5, accuracy_after=0.25,
                                                 relative_change=-0.5)).to_json()
    saved = {("mean_mode" if k == "mean" else k): v for k, v in now.items()}
    saved["config"] = {"mean_mode": "global", "k": 4}
    folder = tmp_path / "run"
    (folder / "knockout").mkdir(parents=True)
    (folder / "knockout" / "knockout.json").write_text(json.dumps(saved))
    record = RunFolder(folder).knockout_record
    assert record is not None and record.mean == "global" and record.config == {"mean": "global", "k": 4}
    assert record.to_json() == now
    # results.json: the eval config's knockout_mean, and a knockout row's info that called the mean "mode"
    results = {"config": {"benchmarks": ["gsm8k"], "knockout_mean": "global"},
               "variants": [{"label": "m - 1 head", "info": {"knockout": {"heads": [[0, 1]], "mode": "global"}},
                             "benchmarks": {"gsm8k": {"accuracy": 0.5, "n": 2}}}]}
    (folder / "eval").mkdir()
    (folder / "eval" / "results.json").write_text(json.dumps(results))
    table = RunFolder(folder).eval_record
    assert table is not None and table.config == {"benchmarks": ["gsm8k"], "mean": "global"}
    assert table.variants[0].info.knockout is not None and table.variants[0].info.knockout.mean == "global"


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

"""A new setting is one edit: a field added to a step's settings type is, with nothing else changed, a flag of the
step's command, a key of the run config's section, part of the stage's signature (so changing it re-runs the stage)
and a value the step is called with; where the step saves its settings or keys a checkpoint by them, it is in those
too. All seven steps: data, identify, knockout, attention, mlp, finetune and eval.

The test copies the package, makes that one edit to the copy (a field after the class's docstring) and asks the
copy; the walk in test_step_settings checks the same paths for every field that exists today.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import keyheads

PACKAGE = Path(keyheads.__file__).parent
FIELD = '    probe_setting: int = Field(default=7, ge=0, description="a setting added by one edit")\n'

# step: (module of its settings type, the class, the command and run section, the pipeline function it calls)
STEPS = {
    "data": ("data/settings.py", "PairSettings", "data", "pairs_for"),
    "identify": ("patching/settings.py", "IdentifySettings", "identify", "identify"),
    "knockout": ("analysis/settings.py", "KnockoutSettings", "knockout", "run_knockout"),
    "attention": ("analysis/settings.py", "AttentionSettings", "attention", "run_attention"),
    "mlp": ("analysis/settings.py", "MLPSettings", "mlp", "run_mlp"),
    "finetune": ("finetune/settings.py", "TrainingRecipe", "finetune", "finetune"),
    "eval": ("evaluation/settings.py", "EvalSettings", "eval", "evaluate"),
}

# what each step saves of its settings and keys its checkpoint by, built by the step's own code from its settings
# (the steps not listed save none beyond their stage record, which is the signature, and resume by whole stages;
# eval's per-item cache is keyed by what each benchmark's answers depend on: keyheads.evaluation.tasks)
SAVED = {"knockout": "record", "finetune": "record", "identify": "stage record"}
RESUMED = {"identify": "checkpoint_key", "knockout": "key_record", "finetune": "checkpoint record"}

# run in the edited copy, for each step: its command's flags, the run config's key, the stage's signature, the call,
# what it saves and what its checkpoint is keyed by
PROBE = """
import argparse, json, sys
from keyheads import pipeline
from keyheads.analysis.knockout_run import _Call
from keyheads.cli import build_parser
from keyheads.config.run import RunSettings
from keyheads.selection import HeadChoice


def saved_and_resumed(section, cfg, stages):
    settings = getattr(cfg, section)
    if section == "identify":
        return stages[0].settings.get("probe_setting"), settings.checkpoint_key().get("probe_setting")
    if section == "knockout":
        call = _Call("pairs.jsonl", "out", HeadChoice(), settings, None, None, 8, False)
        return call.record().get("probe_setting"), call.key_record().get("probe_setting")
    if section == "finetune":  # finetune.json's config and the checkpoint's record are the recipe's to_json
        recipe = settings.recipe("full", cfg.seed).to_json()
        return recipe.get("probe_setting"), recipe.get("probe_setting")
    return None, None


parser = build_parser()
commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
found = {}
for section, step in json.loads(sys.argv[1]).items():
    given = {"out": sys.argv[2], "model": "tiny", "variants": ["full"], "identify": {"top_k": 2},
             "finetune": {"train": "arith:multidigit:8"}, "eval": {"benchmarks": ["arith-add"]}}
    given[section] = {**given.get(section, {}), "probe_setting": 11}
    cfg = RunSettings.make(**given)
    seen = []
    def record(*args, **kwargs):
        seen.extend([*args, *kwargs.values()])
    setattr(pipeline, step, record)
    for name in ("load_examples", "describe_training", "describe_knockout", "describe_attention", "describe_mlp",
                 "describe_effects", "write_pairs"):
        setattr(pipeline, name, lambda *a, **k: [])
    if step == "identify":  # the stage unpacks (effects, key heads)
        def identify_and_record(*args, **kwargs):
            record(*args, **kwargs)
            return None, None
        setattr(pipeline, step, identify_and_record)
    pipeline.models.load_placed = lambda *a, **k: (None, type("W", (), {"run_on": "cpu"})())
    pipeline.key_heads = lambda run: type("K", (), {"heads": ()})()
    pipeline._key_heads = lambda run: None
    stages = [s for s in pipeline.build_stages(cfg, sys.argv[2], lambda: type("M", (), {"name": "tiny"})(),
                                               progress=False) if s.name.split("/")[0] == section]
    for s in stages:
        s.run()
    saved, resumed = saved_and_resumed(section, cfg, stages)
    found[section] = {
        "flag": "--probe-setting N" in commands[section].format_help(),
        "yaml": getattr(cfg, section).probe_setting,
        "signature": [s.settings.get("probe_setting") for s in stages],
        "called": [getattr(a, "probe_setting", None) for a in seen if hasattr(a, "probe_setting")],
        "saved": saved,
        "resumed": resumed,
    }
print(json.dumps(found))
"""


def test_a_new_field_is_one_edit(tmp_path):
    root = tmp_path / "src"
    shutil.copytree(PACKAGE, root / "keyheads", ignore=shutil.ignore_patterns("__pycache__"))
    for module, cls, _, _ in STEPS.values():  # one edit per step, each in its own class
        path = root / "keyheads" / module
        lines = path.read_text().splitlines(keepends=True)
        start = next(i for i, line in enumerate(lines) if line.startswith(f"class {cls}("))
        end = next(i for i in range(start + 1, len(lines)) if lines[i].rstrip().endswith('"""'))  # docstring's end
        lines.insert(end + 1, FIELD)
        path.write_text("".join(lines))
    steps = {command: function for _, _, command, function in STEPS.values()}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(steps), str(tmp_path / "run")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    for step, where in found.items():
        assert where["flag"], f"{step}: no --probe-setting flag"
        assert where["yaml"] == 11, f"{step}: the run config lost the key"
        assert where["signature"] and all(v == 11 for v in where["signature"]), f"{step}: not in the signature"
        assert where["called"] and all(v == 11 for v in where["called"]), f"{step}: the step never got it"
        if step in SAVED:
            assert where["saved"] == 11, f"{step}: its saved settings ({SAVED[step]}) lost it"
        if step in RESUMED:
            assert where["resumed"] == 11, f"{step}: its checkpoint key ({RESUMED[step]}) lost it"
    assert set(found) == set(steps) and len(steps) == 7


def test_without_the_edit_there_is_no_such_setting(tmp_path, capsys):
    """The test can fail: the package as it is has no such flag, and its run config refuses the key."""
    from keyheads.cli import main  # noqa: PLC0415
    from keyheads.config.run import RunSettings  # noqa: PLC0415
    from keyheads.errors import SettingError  # noqa: PLC0415

    with pytest.raises(SystemExit):
        main(["knockout", "--help"])
    assert "--probe-setting" not in capsys.readouterr().out
    with pytest.raises(SettingError, match="knockout.probe_setting: 11 given; unknown setting"):
        RunSettings.make(out=str(tmp_path / "run"), knockout={"probe_setting": 11})

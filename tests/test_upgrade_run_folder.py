"""tools/upgrade_run_folder.py, the one converter of run folders saved before the knockout mean had one name: the
package refuses such a folder and names the tool; the tool rewrites it so that every reader takes it, keeps every
value, and changes nothing when run again. The fixture's mean is "global", not the default, so a converter that
dropped it would fail here."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from keyheads.errors import BadFile
from keyheads.results.run import SavedConfig
from keyheads.runfolder import RunFolder

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "upgrade_run_folder.py"
FIXTURE = ROOT / "tools" / "fixtures" / "run-before-one-mean"


def _tool():
    return load_script(TOOL, "upgrade_run_folder")


def _keys(data) -> set[str]:
    if isinstance(data, dict):
        return set(data) | {k for v in data.values() for k in _keys(v)}
    if isinstance(data, list):
        return {k for v in data for k in _keys(v)}
    return set()


def _upgrade(folder: Path) -> str:
    done = subprocess.run([sys.executable, str(TOOL), str(folder)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def old_run(tmp_path) -> Path:
    return Path(shutil.copytree(FIXTURE, tmp_path / "run"))


def test_an_old_run_folder_is_refused_naming_the_tool(old_run):
    with pytest.raises(BadFile, match=r"knockout\.json .*tools/upgrade_run_folder\.py"):
        _ = RunFolder(old_run).knockout_record


def test_the_tool_converts_an_old_run_folder_once(old_run):
    before = {p.relative_to(old_run): json.loads(p.read_text()) for p in old_run.rglob("*.json")}
    assert "4 file(s) rewritten" in _upgrade(old_run)
    folder = RunFolder(old_run)
    knockout = folder.knockout_record
    assert knockout is not None and knockout.mean == "global" and knockout.config["mean"] == "global"
    results = folder.eval_record
    assert results is not None
    rows = [v.info.knockout for v in results.variants if v.info.knockout is not None]
    assert rows and all(row.mean == "global" for row in rows)
    config = json.loads((old_run / "config.json").read_text())
    assert SavedConfig.from_json(config).knockout_mean == "global" and "mean" not in config["eval"]
    # the identify stage's section, once `patch:`, keeps its values under its name
    assert "patch" not in config and config["identify"] == before[Path("config.json")]["patch"]
    assert json.loads((old_run / "stages" / "eval.json").read_text())["settings"]["mean"] == "global"
    old = set(_tool().OLD)
    for path in old_run.rglob("*.json"):
        assert not _keys(json.loads(path.read_text())) & old, path
    # nothing but the names changed: the knockout record's numbers are the fixture's
    saved = json.loads((old_run / "knockout" / "knockout.json").read_text())
    was = before[Path("knockout/knockout.json")]
    assert {k: v for k, v in saved.items() if k not in ("mean", "config")} == \
        {k: v for k, v in was.items() if k not in old | {"config"}}
    assert json.loads((old_run / "model.json").read_text()) == before[Path("model.json")]
    # again: nothing to do, every byte kept
    files = {p: p.read_bytes() for p in old_run.rglob("*.json")}
    assert "0 file(s) rewritten" in _upgrade(old_run)
    assert {p: p.read_bytes() for p in old_run.rglob("*.json")} == files


def test_the_tool_refuses_what_is_not_a_folder(tmp_path):
    done = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert done.returncode == 2 and "not a folder" in done.stderr and "Traceback" not in done.stderr

"""Rewrite a run folder, or a config, saved under old names, so that this keyheads reads it.

The identify stage's settings were the `patch:` section of a config (a run folder's config.json, a YAML config),
`patch` inside an identify/NAME stage record, and the planner's stage `patch`; they are `identify` now.

Releases before the one mean saved it as `mean_mode` (knockout.json, its config, the run config's knockout
section), as `knockout_mean` (the eval settings, the run config's eval section, stage records) and, in a
knockout row's info of the eval results, as `mode`. keyheads now reads only `mean`; an old knockout.json is
refused as a bad file. This script is the one converter, kept outside the package so that no reader knows
the old names:

    python tools/upgrade_run_folder.py RUN_FOLDER_OR_CONFIG [...]

A YAML config has its `patch:` line renamed, its comments kept. Every JSON file under each folder is read, renamed in
place (written atomically) when it holds an old name, and left byte-identical otherwise; running it twice changes
nothing the second time.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from keyheads.io import atomic_write_text, write_json

OLD = ("mean_mode", "knockout_mean")
RUN_SECTIONS = {"data", "knockout", "attention", "mlp", "finetune", "eval"}  # a run config has these beside `patch`
PLANNED = {"patch": "identify", "patch attribution": "identify attribution"}  # the planner's old stage names


def renamed(data: Any, path: tuple[str, ...] = ()) -> Any:
    """`data` with every old name of the mean written `mean`, the run config's eval mean moved to its knockout
    section (a run has one mean), and an eval settings' mean dropped (the rows carry it)."""
    if isinstance(data, list):
        return [renamed(v, path) for v in data]
    if not isinstance(data, dict):
        return data
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in OLD:
            if key == "knockout_mean" and path[-1:] != ("knockout",):
                continue  # the eval settings' copy: moved (run config) or carried by the rows (results)
            out.setdefault("mean", value)
        elif key == "mode" and path[-2:] == ("info", "knockout"):
            out.setdefault("mean", value)
        elif key == "patch" and isinstance(value, dict) and (path[-1:] == ("settings",) or RUN_SECTIONS & set(data)):
            out["identify"] = renamed(value, (*path, "identify"))  # a run config's section, an identify stage's
        elif key == "stage" and value in PLANNED:
            out[key] = PLANNED[value]
        else:
            out[key] = renamed(value, (*path, key))
    # the run config: its eval section's mean becomes the knockout section's, unless that one says
    evaluation, knockout = data.get("eval"), out.get("knockout")
    if isinstance(evaluation, dict) and "knockout_mean" in evaluation and isinstance(knockout, dict):
        knockout.setdefault("mean", evaluation["knockout_mean"])
    # a stage record's settings: the eval stage's mean is the run's mean
    settings = out.get("settings")
    if path == () and isinstance(settings, dict) and isinstance(data.get("settings"), dict) \
            and "knockout_mean" in data["settings"]:
        settings.setdefault("mean", data["settings"]["knockout_mean"])
    return out


def upgrade(folder: Path) -> list[Path]:
    """Rewrite the JSON files under `folder` that use an old name -> the files rewritten."""
    changed = []
    for path in sorted(folder.rglob("*.json")):
        text = path.read_text()
        if not any(f'"{name}"' in text for name in (*OLD, "mode", "patch")):
            continue
        data = json.loads(text)
        new = renamed(data)
        if new == data:
            continue
        write_json(path, new)  # atomic, in the format keyheads writes
        changed.append(path)
    return changed


def upgrade_yaml(path: Path) -> bool:
    """Rename a YAML config's top-level `patch:` to `identify:` in its text (comments kept) -> whether it changed."""
    text = path.read_text()
    new = re.sub(r"^patch:", "identify:", text, flags=re.MULTILINE)
    if new != text:
        atomic_write_text(path, new)
    return new != text


def main(argv: list[str]) -> int:
    if not argv or any(a.startswith("-") for a in argv):
        print(__doc__.strip().splitlines()[0] + "\nusage: python tools/upgrade_run_folder.py RUN_FOLDER [...]",
              file=sys.stderr)
        return 2
    for name in argv:
        folder = Path(name)
        if folder.suffix in (".yaml", ".yml") and folder.is_file():
            print(f"{folder}: {'rewritten' if upgrade_yaml(folder) else 'nothing to change'}")
            continue
        if not folder.is_dir():
            print(f"{folder}: not a folder; give a run folder (the --out of keyheads run) or a YAML config",
                  file=sys.stderr)
            return 2
        changed = upgrade(folder)
        print(f"{folder}: {len(changed)} file(s) rewritten" + "".join(f"\n  {p.relative_to(folder)}" for p in changed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""A run's resolved settings as YAML, each value with where it came from (`keyheads run CONFIG --print-config`), as
Hydra's `--cfg job` prints a job's config: a flag, the config file, the demo's own settings, a value derived from
another setting, or the default of its type.

The printed text is a valid config: loaded back with `keyheads run`, it gives the same settings.
"""
from __future__ import annotations

import json
from typing import Any

import yaml

from ..section import Section
from .run import RunSettings

# values a run sets from another setting when they are not given (keyheads.config.run.RunSettings)
DERIVED = {
    "identify.first_token": "derived: on unless data.single_token_answer",
    "eval.split": "derived: heldout when the variants train on 'trainset', else full",
}
SEEDED = "derived: the run's seed"


def _has(tree: Any, path: list[str]) -> bool:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return False
        tree = tree[key]
    return True


def source(path: list[str], file: dict, flags: dict, preset: dict, preset_name: str) -> str:
    """Where the setting at `path` came from (the first that gives it: flag, file, preset, derived, default)."""
    if _has(flags, path):
        return "flag"
    if _has(file, path):
        return "config file"
    if _has(preset, path):
        return preset_name
    dotted = ".".join(path)
    if dotted in DERIVED:
        return DERIVED[dotted]
    if len(path) == 2 and path[1] == "seed":
        return SEEDED
    return "default"


def _scalar(value: Any) -> str:
    """One value as YAML writes it inline (flow style: lists and maps on one line)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("\n...").strip()


def describe(cfg: RunSettings, file: dict | None = None, flags: dict | None = None, preset: dict | None = None,
             preset_name: str = "demo") -> str:
    """The settings as YAML, one value a line, each followed by `# SOURCE`."""
    data = json.loads(json.dumps(cfg.to_json()))
    lines = []
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(getattr(cfg, key, None), Section):  # a section: a line per key
            lines.append(f"{key}:")
            for sub, v in value.items():
                where = source([key, sub], file or {}, flags or {}, preset or {}, preset_name)
                lines.append(f"  {sub}: {_scalar(v)}  # {where}")
        else:
            where = source([key], file or {}, flags or {}, preset or {}, preset_name)
            lines.append(f"{key}: {_scalar(value)}  # {where}")
    return "\n".join(lines) + "\n"

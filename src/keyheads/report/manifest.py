"""Section 8, the manifest: what produced these numbers (versions, model, data, seeds, settings, times).

Only what the run recorded is shown. The interpreter rendering the report is not the one that
computed the numbers, so its versions are never filled in for missing records.
"""
from __future__ import annotations

import json
from typing import Any

from markupsafe import Markup

from ..effects import Effects
from ..io import file_sha256
from ..results.finetune import FinetuneResult
from ..results.run import ModelInfo, StageRecord
from ..runfolder import FINETUNE_JSON, KNOCKOUT_JSON, RunFolder
from .markup import MACROS, bullet_list, cell, heading, is_num, join, note, num, section, table

NOT_RECORDED = "not recorded"
VERSION_KEYS = ("keyheads", "commit", "torch", "transformers", "python")


def _version(versions: dict[str, str], package: str) -> str:
    return versions[package] if package in versions else NOT_RECORDED


def _versions(records: dict[str, StageRecord], runs: dict[str, FinetuneResult]) -> Markup:
    sources: dict[str, dict[str, str]] = {RunFolder.stage_rel(k): r.versions for k, r in records.items()}
    sources.update({f"{RunFolder.finetune_rel(k)}/{FINETUNE_JSON}": r.versions for k, r in runs.items()})
    if not sources:
        return table(["package", "version"], [[k, NOT_RECORDED] for k in VERSION_KEYS], "versions")
    distinct = {json.dumps(v, sort_keys=True) for v in sources.values()}
    if len(distinct) == 1:
        v = next(iter(sources.values()))
        return table(["package", "version"], [[k, _version(v, k)] for k in VERSION_KEYS], "versions")
    # stages computed under different versions: show each, the reader has to know
    return join([note("The stages were computed under different versions:"),
                 table(["recorded by", *VERSION_KEYS], [[k, *[_version(v, p) for p in VERSION_KEYS]]
                                                         for k, v in sources.items()], "versions")], "")


def _fingerprints(records: dict[str, StageRecord], runs: dict[str, FinetuneResult],
                  model_info: ModelInfo | None) -> list[str]:
    """Each model fingerprint the run recorded, with where (one line per distinct value)."""
    seen: dict[str, list[str]] = {}
    if model_info is not None and model_info.fingerprint:
        seen[model_info.fingerprint] = [RunFolder.MODEL]
    for name, rec in records.items():
        given = rec.settings
        for fingerprint in (given.fingerprint, given.model_fingerprint, given.base_fingerprint):
            if fingerprint:
                seen.setdefault(fingerprint, []).append(RunFolder.stage_rel(name))
    for name, info in runs.items():
        if info.base_fingerprint:
            seen.setdefault(info.base_fingerprint, []).append(RunFolder.finetune_rel(name))
    return [f"{fp} ({', '.join(where)})" for fp, where in seen.items()]


def _data(run: RunFolder, records: dict[str, StageRecord], effects: Effects | None) -> list[list]:
    """The pairs file's sha256 as recorded, and whether the file in the folder still has it."""
    outputs = records["data"].outputs if "data" in records else {}
    recorded = outputs[RunFolder.PAIRS] if RunFolder.PAIRS in outputs else None
    source = RunFolder.stage_rel("data") if recorded else None
    if not recorded and effects is not None and effects.data_sha256:
        recorded, source = effects.data_sha256, RunFolder.EFFECTS
    path = run.pairs
    now = file_sha256(path) if path.is_file() else None
    if recorded and now:
        status = "matches the file" if now == recorded else f"DIFFERS from the file now ({now[:16]}…)"
    else:
        status = "file missing" if recorded else "no hash recorded"
    lines = sum(1 for line in open(path, encoding="utf-8") if line.strip()) if path.is_file() else None
    return [[RunFolder.PAIRS, cell(lines, str(lines) if lines is not None else "–"), recorded or NOT_RECORDED,
             source or "–", status]]


def _stage_times(run: RunFolder, records: dict[str, StageRecord]) -> Markup:
    if records:
        rows = [[name, cell(r.seconds, num(r.seconds, ".1f")), r.finished or "–", r.signature[:16] or "–",
                 ", ".join(sorted(r.outputs)) or "–"]
                for name, r in records.items()]
        total = sum(r.seconds for r in records.values() if is_num(r.seconds))
        return join([table(["stage", "seconds", "finished", "signature", "outputs"], rows, "stages"),
                     note(f"Total: {total:.1f} s.")], "")
    # no records: the seconds some outputs carry themselves (releases before the stage records), labelled as such
    keys, ko = run.key_heads_record, run.knockout_record
    own = [("identify", RunFolder.KEY_HEADS, keys.seconds if keys is not None else None),
           ("knockout", f"{RunFolder.KNOCKOUT}/{KNOCKOUT_JSON}", ko.seconds if ko is not None else None)]
    rows = [[stage, cell(secs, f"{secs:.1f}"), rel] for stage, rel, secs in own if is_num(secs)]
    for name, info in run.finetune_records.items():
        secs = info.train.wall_seconds
        if is_num(secs):
            folder = RunFolder.finetune_rel(name)
            rows.append([folder, cell(secs, f"{secs:.1f}"), f"{folder}/{FINETUNE_JSON}"])
    text = note("Stage records (stages/*.json): not recorded. Times below are those the outputs carry themselves.")
    return join([text, table(["stage", "seconds", "from"], rows, "stages") if rows else ""], "")


def _machine(records: dict[str, StageRecord]) -> Markup:
    machines = {json.dumps(r.machine, sort_keys=True) for r in records.values() if r.machine}
    if not machines:
        return note(f"Machine: {NOT_RECORDED}.")
    return join((table(["key", "value"], [[k, json.dumps(v) if not isinstance(v, str) else v]
                                          for k, v in json.loads(m).items()], "machine") for m in sorted(machines)), "")


def manifest(run: RunFolder) -> Markup:
    records = run.stage_records
    runs = run.finetune_records
    config = run.config_record  # the effective settings, as given
    effects = run.effects_record
    info = run.model_record  # what the pipeline loaded: name, source, fingerprint, shape
    model = config.model if config is not None else None
    if not model and effects is not None:  # an older run without config.json
        model = effects.model
    loaded = ""
    if info is not None:
        loaded = (f" Loaded from {info.source}: {info.n_layers} layers × {info.n_heads} heads, {info.dtype} on "
                  f"{info.device}.")
    saved = config.to_json() if config is not None else {}
    seeds: dict[str, Any] = {k: saved[k] for k in ("seed", "seeds") if k in saved}
    seeds.update({f"{RunFolder.finetune_rel(k)} seed": r.config.seed for k, r in runs.items()})
    fingerprints = _fingerprints(records, runs, info)
    body = [MACROS.model_line(model or NOT_RECORDED, "; ".join(fingerprints) if fingerprints else NOT_RECORDED, loaded),
            heading("Versions"), _versions(records, runs),
            heading("Data"), table(["file", "lines", "sha256", "recorded in", "check"], _data(run, records, effects),
                                   "data"),
            heading("Seeds"), bullet_list(f"{k}: {v}" for k, v in seeds.items()) or note(NOT_RECORDED),
            heading("Stages"), _stage_times(run, records),
            heading("Machine"), _machine(records),
            heading("Configuration")]
    if config is not None:
        body.append(table(["setting", "value"], [[k, json.dumps(v)] for k, v in saved.items()], "config"))
    else:
        body.append(note(f"config.json: {NOT_RECORDED}."))
    return section("manifest", "8. Manifest", join(body))

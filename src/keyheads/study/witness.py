"""A witness that a change of code left a study's numbers as they were, so that committed cells can be re-signed
after a refactor instead of re-run (tools/resign_cells.py --witness OLD).

A cell's code signature (keyheads.study.code) makes it stale when any statement of a module it computed with
changes, though a refactor (a typed result read where a dict was) leaves every number as it was. Re-running the
cells takes hours; the witness takes minutes, and it proves only what it reaches:
1. A tiny study with every kind of cell (pairs, identify, knockout, attention, MLPs, the eval rows, a rate grid and
   precise, precise+MLP, random, LoRA and full fine-tunes) runs on a random tiny model of each family asked for:
   once with the old sources and twice with today's, each in the same folder. The first family's study runs again
   with its precise and full fine-tunes under FSDP2 (one process: the sharded loading and checkpointing path), and
   twice more, slimmed to identify and one eval row, to reach identify's other ways (attribution patching, and
   key heads read from a circuit graph that `keyheads export` wrote of its run). A tiny GGUF file is converted
   into an empty model cache the same three ways (`keyheads generate --model FILE.gguf`), and the cache's files
   compared: every bundled model's cells read their weights from such a cache.
2. What today's two runs disagree on is a time or a machine's detail, not a number, and is left out: a whole file,
   or in a JSON file the values at the keys that differ, and always the values under keys that name a time
   (`NOT_RESULTS`). Everything else must be byte-equal (JSON: value-equal) to
   the old run's.
3. Every changed line of the signed modules (`git diff OLD`) that is a statement must have run in today's witness
   (coverage.py), or in today's run resumed as if every stage had been interrupted after writing its outputs (which
   must then be as they were), but for a `raise` and an `except` that only raises (`raising_lines`): a change the
   witness does not reach is not witnessed, and nothing is re-signed.
"""
from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..io import file_sha256, write_json
from ..testing.benchmarks import write_tiny_benchmarks
from ..testing.tiny_gguf import write_tiny_gguf

Leaf = tuple[str, ...]  # a JSON value's place: the keys (and list indices) down to it
# words in the keys of times, a machine's details and provenance (the versions, with the commit; a fingerprint, a
# hash over a file that holds them), never a result: two runs can agree on a rounded time by chance ("second" covers
# wall_seconds, seconds_this_run, samples_per_second, ...). What a fingerprint hashes is compared itself.
TEXT = (".md", ".csv", ".txt", ".html", ".svg")
NOT_RESULTS = ("second", "timing", "speed", "finished", "versions", "machine", "fingerprint")
# identify's other ways, each a slim study on the first family: attribution patching (and its comparison with exact
# path patching), and key heads read from a circuit graph (`keyheads export` of the first family's run)
PROBES = ("attribution", "circuit")


@dataclass
class Outcome:
    """What the witness saw: `differ` the outputs the change altered, `unreached` the changed statements no witness
    run executed ("module.py:LINE"), `volatile` what was left out as differing between two runs of one code."""

    compared: int = 0
    differ: list[str] = field(default_factory=list)
    unreached: list[str] = field(default_factory=list)
    volatile: list[str] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return self.compared > 0 and not self.differ and not self.unreached


def study_config(root: Path, family: str, fsdp: bool = False, probe: str = "", circuit: Path | None = None) -> Path:
    """A tiny study of every kind of cell on a random `family` model, written under `root` -> its config. `fsdp`:
    its fine-tunes (precise and full only) under FSDP2 in one process, which loads the model as a skeleton and reads
    its weights shard by shard (keyheads.models.sharded), as a multi-process run does. `probe`: a study of identify
    and one eval row only, by another way to identify (one of PROBES; "circuit" reads the graph file `circuit`)."""
    from ..testing.tiny import tiny_model  # noqa: PLC0415 (loads transformers' model classes)

    model = tiny_model(family, seed=0)
    model.hf.save_pretrained(root / "model")
    model.tokenizer.save_pretrained(root / "model")
    (root / "train.jsonl").write_text("".join(json.dumps({"prompt": f"{a} + 1 = ", "completion": str(a + 1)}) + "\n"
                                              for a in range(12)))
    (root / "benchmarks").mkdir()
    write_tiny_benchmarks(root / "benchmarks")
    config = {"model": str(root / "model"), "batch_size": 4, "seed": 0, "data_dir": str(root / "benchmarks"),
              "data": {"keep_correct": False, "n": 16, "task": "addition", "shared_prefix": True},
              # limits below the 16 pairs, so that the seeded subsets are drawn
              "identify": {"top_k": 3}, "knockout": {"k": 3, "seeds": 2, "limit": 12, "transfer_n": 4},
              "attention": {"limit": 12}, "mlp": {"limit": None},
              "variants": ["precise", "precise@2+mlp1", "random@2", "lora", "full"],
              "finetune": {"train": str(root / "train.jsonl"), "epochs": 1, "optimizer_batch_size": 4,
                           "micro_batch_size": 2, "lr_grid": {"precise": [1e-3, 3e-3], "full": [1e-4, 3e-4]},
                           "grid_fraction": 0.5, "validation": 4, "mlps": 1},
              "eval": {"benchmarks": ["arith-add", "mmlu", "generic-kl"], "limit": 4, "few_shot": 1}}
    if fsdp:
        config |= {"variants": ["precise", "full"],
                   "finetune": {"train": str(root / "train.jsonl"), "epochs": 1, "optimizer_batch_size": 4,
                                "micro_batch_size": 2, "parallel": "fsdp", "validation": 4, "mlps": 1},
                   "eval": {"benchmarks": ["arith-add", "generic-kl"], "limit": 4, "few_shot": 1}}
    if probe:
        config |= {"variants": [], "eval": {"benchmarks": ["arith-add"], "limit": 4, "few_shot": 1}}
        config.pop("finetune")
        if probe == "attribution":
            config["identify"] = {"top_k": 3, "method": "attribution"}
        else:
            config["circuit"] = str(circuit)
    path = root / "study.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def _keyheads(src: Path, args: list[str], failed: str, coverage_file: Path | None = None,
              env: dict[str, str] | None = None) -> None:
    """`keyheads ARGS` with the package at `src` (a checkout's src folder), under coverage.py when `coverage_file`
    is given, with `env` added to the environment; a failure raises with `failed` and the command's error output."""
    # one hash seed for every run: a set written as a list (PEFT's target_modules) keeps one order
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0", **(env or {})}
    head = [sys.executable, "-m"]
    if coverage_file is not None:
        head += ["coverage", "run", f"--data-file={coverage_file}", f"--include={src}/keyheads/*", "-m"]
    done = subprocess.run([*head, "keyheads", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{failed}:\n{done.stderr[-3000:]}")


def run_study(src: Path, config: Path, out: Path, coverage_file: Path | None = None, fresh: bool = True) -> None:
    """`keyheads run CONFIG` with the package at `src`, into `out` (cleared first unless not `fresh`); under
    coverage.py when `coverage_file` is given."""
    if fresh:
        shutil.rmtree(out, ignore_errors=True)
    _keyheads(src, ["run", str(config), "--out", str(out), "--quiet", "--threads", "1"],
              f"the witness study failed with the sources in {src}", coverage_file)


def outputs(folder: Path) -> dict[str, Any]:
    """{file relative to the folder: its JSON value (a .json file), its tensors' sha256 and its metadata (a
    .safetensors file), its lines' words (a table or page) or its sha256 (any other file)}, less the stage records
    (stages/: the hashes of the same files, with their times and the machine), the per-item caches (*.sqlite:
    keyed by fingerprints, their rows are in the results) and the report (no cell holds it: a page of the other
    files, with the commit it was made at)."""
    out: dict[str, Any] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel.startswith("stages/") or path.suffix == ".sqlite" or rel == "report.html":
            continue
        if path.suffix == ".safetensors":
            out[rel] = _safetensors(path)
            continue
        if path.suffix in TEXT:  # compared word by word: a table's time column is left out, not the whole table
            out[rel] = [re.split(r"[\s|,]+", line) for line in path.read_text().splitlines()]
            continue
        if path.suffix == ".json":
            try:
                out[rel] = json.loads(path.read_text())
                continue
            except ValueError:
                pass
        out[rel] = file_sha256(path)
    return out


def _safetensors(path: Path) -> dict[str, Any]:
    """A safetensors file as its tensors' hashes and its metadata (JSON values read as JSON): the metadata holds the
    versions it was written with."""
    from safetensors import safe_open  # noqa: PLC0415

    with safe_open(str(path), "pt") as f:
        meta = {}
        for key, text in (f.metadata() or {}).items():
            try:
                meta[key] = json.loads(text)
            except ValueError:
                meta[key] = text
        tensors = {k: hashlib.sha256(f.get_tensor(k).contiguous().view(-1).view(torch.uint8).numpy().tobytes())
                   .hexdigest() for k in sorted(f.keys())}
    return {"tensors": tensors, "metadata": meta}


def leaves(value: Any, at: Leaf = ()) -> dict[Leaf, Any]:
    """Every leaf of a JSON value by its place."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in leaves(item, (*at, str(key))).items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in leaves(item, (*at, str(i))).items()}
    return {at: value}


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _differing(a: dict, b: dict) -> set:
    return {k for k in a.keys() | b.keys() if k not in a or k not in b or not _same(a[k], b[k])}


def _a_time(place: Leaf) -> bool:
    return any(word in part for part in place for word in NOT_RESULTS)


def compare(old: dict[str, Any], new: dict[str, Any], again: dict[str, Any], outcome: Outcome) -> None:
    """Old against new outputs, leaving out what new and again (two runs of today's code) disagree on."""
    for name in sorted(old.keys() | new.keys() | again.keys()):
        if name not in new and name not in again:
            outcome.differ.append(f"{name} (no longer written)")
            continue
        if (name in new) != (name in again) or (not isinstance(new[name], (dict, list))
                                                and new[name] != again[name]):
            outcome.volatile.append(name)  # today's two runs disagree on the whole file
            continue
        if name not in old:
            outcome.differ.append(f"{name} (new)")
            continue
        a, b, c = leaves(old[name]), leaves(new[name]), leaves(again[name])
        if not isinstance(new[name], (dict, list)):
            a, b, c = {(): old[name]}, {(): new[name]}, {(): again[name]}
        times = {k for k in a.keys() | b.keys() if _a_time(k)}
        skip = _differing(b, c) | times
        outcome.volatile += [f"{name}:{'.'.join(k)}" for k in sorted(skip - times)]
        bad = sorted(k for k in _differing(a, b) - skip)
        outcome.differ += [f"{name}:{'.'.join(k) or '(file)'}" for k in bad[:5]]
        outcome.compared += 1


def changed_lines(repo: Path, old: str, modules: list[str]) -> dict[str, set[int]]:
    """{module (relative to src/keyheads): the lines of today's file that `git diff OLD` adds or changes, and for a
    deletion the line after it}."""
    out: dict[str, set[int]] = {}
    for module in modules:
        diff = subprocess.run(["git", "-C", str(repo), "diff", "-U0", old, "--", f"src/keyheads/{module}"],
                              check=True, capture_output=True, text=True).stdout
        for line in diff.splitlines():
            if line.startswith("@@"):
                new = line.split("+", 1)[1].split(" ", 1)[0]
                start, _, count = new.partition(",")
                n = int(count) if count else 1
                out.setdefault(module, set()).update(range(int(start), int(start) + n) if n else {int(start) + 1})
    return out


def raising_lines(text: str) -> set[int]:
    """The lines of a module's `raise` statements, and of each `except` clause that only raises. A witness run that
    reached one would end in that error, so no run that writes outputs can reach it; what it raises is not a number
    the study keeps (its words are not even signed, keyheads.study.code), and the condition or call that leads to it
    is a statement of its own that must be reached."""
    nodes = [node for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Raise)
             or isinstance(node, ast.ExceptHandler) and all(isinstance(b, ast.Raise) for b in node.body)]
    return {n for node in nodes for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)}


def unreached(coverage_files: list[Path], src: Path, changed: dict[str, set[int]]) -> list[str]:
    """The changed lines that are statements (coverage.py's analysis) and that no witness run executed."""
    import coverage  # noqa: PLC0415 (a development tool, only the witness needs it)

    data = coverage.CoverageData(basename=str(coverage_files[0]))
    data.read()
    for extra in coverage_files[1:]:
        more = coverage.CoverageData(basename=str(extra))
        more.read()
        data.update(more)
    cov = coverage.Coverage(data_file=None)
    out = []
    for module, lines in sorted(changed.items()):
        path = (src / "keyheads" / module).resolve()
        if not path.is_file():
            continue  # a module deleted outright: its callers' changed lines speak for it
        executed = set(data.lines(str(path)) or [])
        statements = set(cov.analysis2(str(path))[1]) - raising_lines(path.read_text(encoding="utf-8"))
        out += [f"{module}:{n}" for n in sorted(lines & statements - executed)]
    return out


def interrupt(run: Path) -> None:
    """Make every stage of a finished run folder look interrupted after its work was written: its record gone, its
    start file left (keyheads.stages), so that a re-run resumes each one from what it finds."""
    for record in (run / "stages").glob("*.json"):
        signature = json.loads(record.read_text())["signature"]
        write_json(record.with_suffix(".started"), {"signature": signature})
        record.unlink()


def convert_gguf(src: Path, gguf: Path, cache: Path, coverage_file: Path | None = None) -> None:
    """`keyheads generate --model GGUF` with the package at `src` and an empty model cache `cache`: the GGUF file is
    converted into the float32 cache (keyheads.models.loading), and the model it makes answers."""
    shutil.rmtree(cache, ignore_errors=True)
    _keyheads(src, ["generate", "--model", str(gguf), "--max-new-tokens", "2", "--threads", "1", "!#"],
              f"the witness could not convert {gguf} with the sources in {src}", coverage_file,
              {"KEYHEADS_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})


def export_circuit(src: Path, run: Path, out: Path) -> Path:
    """`keyheads export RUN` with the package at `src` -> the circuit graph file it wrote."""
    _keyheads(src, ["export", str(run), "--out", str(out)], f"the witness could not export {run}'s circuit")
    return out / "circuit.json"


def three_ways(old_src: Path, new_src: Path, step: Callable[..., None],
               written: Callable[[], dict[str, Any]], coverage_file: Path | None) -> dict[str, dict[str, Any]]:
    """`step(src, coverage_file=...)` with the old sources, then twice with the new ones, the second under coverage.py
    when `coverage_file` is given -> {"old", "new", "again": what each left (`written()`)}."""
    got = {}
    for name, src in (("old", old_src), ("new", new_src), ("again", new_src)):
        step(src, coverage_file=coverage_file if name == "again" else None)
        got[name] = written()
    return got


def witness(old_src: Path, new_src: Path, work: Path, families: list[str],
            changed: dict[str, set[int]] | None = None, fsdp: bool = True, probes: tuple[str, ...] = PROBES,
            gguf: bool = True) -> Outcome:
    """Run the tiny study of each family with the old sources and twice with the new ones (the second under
    coverage.py when `changed` lines are to be checked), and compare what they wrote; `fsdp`: the first family's
    study again with its fine-tunes under FSDP2; `probes`: the slim studies of identify's other ways (of PROBES);
    `gguf`: the conversion of a tiny GGUF file."""
    outcome = Outcome()
    coverage_files = []
    # each family's study, the first one's again with its fine-tunes under FSDP2 (the sharded loading path), and
    # the probes on the first family
    studies = [*((f, "", "") for f in families), *((f, "fsdp", "") for f in families[:1] if fsdp),
               *((families[0], "", p) for p in probes)]
    for family, sharded, probe in studies:
        root = work / "-".join(filter(None, (family, sharded, probe)))
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        (root / "inputs").mkdir()
        circuit = export_circuit(new_src, work / family / "run", root / "inputs" / "export") \
            if probe == "circuit" else None
        config = study_config(root / "inputs", family, bool(sharded), probe, circuit)
        run = root / "run"  # one folder for all three runs: its path inside the outputs is the same
        cov = root / "coverage-again" if changed else None
        got = three_ways(old_src, new_src, partial(run_study, config=config, out=run), partial(outputs, run), cov)
        coverage_files += [cov] if cov else []
        compare(got["old"], got["new"], got["again"], outcome)
        if changed:  # the resumed paths run too: every stage as if interrupted after its outputs were written
            interrupt(run)
            run_study(new_src, config, run, root / "coverage-resumed", fresh=False)
            coverage_files.append(root / "coverage-resumed")
            resumed = Outcome()
            compare(got["again"], outputs(run), outputs(run), resumed)
            outcome.differ += [f"resumed: {d}" for d in resumed.differ]
    if gguf:  # the conversion of a GGUF file into the model cache, which bundled models' cells read weights from
        tiny, cache = write_tiny_gguf(work / "tiny.gguf"), work / "gguf-cache"
        cov = work / "coverage-gguf" if changed else None
        got = three_ways(old_src, new_src, partial(convert_gguf, gguf=tiny, cache=cache),
                         partial(outputs, cache / "models"), cov)
        coverage_files += [cov] if cov else []
        compare(got["old"], got["new"], got["again"], outcome)
    if changed:
        outcome.unreached = unreached(coverage_files, new_src, changed)
    write_json(work / "witness.json", {"families": families, "compared": outcome.compared,
                                       "differ": outcome.differ, "unreached": outcome.unreached,
                                       "volatile": outcome.volatile})
    return outcome

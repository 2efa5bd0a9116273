"""Stages of a run folder that know when they are stale.

A stage declares its settings (the part of the config its results depend on), its inputs
(files earlier stages wrote) and the folder it owns. After it runs, `stages/<name>.json`
records the settings, the sha256 of every input and output, the versions, the time taken and
the machine. A later run skips the stage only when the signature (settings + input hashes) and
the outputs still match that record; otherwise it says why and runs it again. Because the
inputs are hashed, a stage whose upstream results changed re-runs too, and one whose upstream
re-ran to the same bytes does not.

Interrupted stages resume from their own checkpoints (patching per batch, training per N
steps, evaluation per item): `stages/<name>.started` holds the signature the partial work
was made with, and a different signature clears the stage's folder first.

Under a launcher (several processes), the main process alone decides what is stale, clears
folders and writes the records; a `spread` stage runs on every process (it shares its work out
and writes from the main one), any other runs on the main process while the rest wait. The
signature holds nothing about the processes, so a run folder made by N processes is up to
date for any other number.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from . import distributed
from .errors import MissingFile
from .io import file_sha256, read_json, write_json
from .log import logger
from .provenance import changed_settings, machine_record, versions
from .results.run import StageRecord
from .runfolder import RunFolder


@dataclass
class Stage:
    """One step of a run.

    Attributes:
        name: unique in the run ("identify", "finetune/precise-top8", ...); the part before
            a slash is its group, which --stages and --from also accept.
        settings: JSON-serialisable settings its results depend on.
        inputs: run-relative files or folders written by earlier stages.
        owns: run-relative files or folders it writes; cleared before a re-run with another
            signature (except `keep`).
        run: does the work; reads inputs and writes into what it owns; may return a summary for people,
            which the runner says (on the main process).
        keep: run-relative paths inside `owns` that survive clearing and are not outputs (a
            per-item cache keyed by its own settings).
        partial: the stage can run with some inputs missing (the report shows what exists).
        spread: run() uses every process of a launched run (all call it; it writes from the
            main one); otherwise only the main process calls it.
        resume: run-relative glob patterns of resume state whose names depend on the number of
            processes (a checkpoint per process), in `owns` or in `inputs`: never hashed, so that
            the record is the same for any number of processes (those in `owns` are cleared
            with the stage).
    """

    name: str
    settings: dict
    inputs: list[str]
    owns: list[str]
    run: Callable[[], object]
    keep: list[str] = field(default_factory=list)
    partial: bool = False
    spread: bool = False
    resume: list[str] = field(default_factory=list)

    @property
    def group(self) -> str:
        return self.name.split("/", 1)[0]


def _skipped(rel: str, patterns: Sequence[str] = ()) -> bool:
    # resume state (checkpoints, partial arrays) is not a result
    parts = Path(rel).parts
    return (any(p == "checkpoint" or p.startswith(".") for p in parts) or rel.endswith((".partial", ".tmp"))
            or any(fnmatch.fnmatchcase(rel, pattern) for pattern in patterns))


def hash_tree(run: Path, rels: list[str], keep: Sequence[str] = (), skip: Sequence[str] = ()) -> dict[str, str | None]:
    """{run-relative file: sha256} for every file under `rels` but those matching a pattern in
    `skip`, missing ones as None."""
    out: dict[str, str | None] = {}
    kept = [run / k for k in keep]
    for rel in rels:
        path = run / rel
        if path.is_file():
            out[rel] = file_sha256(path)
        elif path.is_dir():
            for p in sorted(path.rglob("*")):
                r = p.relative_to(run).as_posix()
                if p.is_file() and not _skipped(r, skip) and not any(p.is_relative_to(k) for k in kept):
                    out[r] = file_sha256(p)
        else:
            out[rel] = None
    return out


def signature(settings: dict, inputs: dict) -> str:
    text = json.dumps({"settings": settings, "inputs": inputs}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _changes(old: dict, new: dict) -> list[str]:
    """Readable differences between two settings dicts: 'top_k 8 -> 10'."""
    return [f"{key} {json.dumps(a, default=str)} -> {json.dumps(b, default=str)}"
            for key, a, b in changed_settings(old, new, missing="<unset>")]


def _differing(a: dict, b: dict) -> list[str]:
    """The keys whose values differ, or that only one of the two has, sorted."""
    return sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or a[k] != b[k])


class Runner:
    """Runs stages in order into one run folder, skipping the ones that are up to date.

    `selected` (group or stage names) limits what may run; a stale stage that is not selected
    is reported and left as it is. `force` re-runs the selected stages even when up to date.
    """

    def __init__(self, run: str | Path, selected: set[str] | None = None, force: bool = False,
                 say: Callable[[str], None] = logger.info):
        self.run = Path(run)
        self.selected, self.force, self.say = selected, force, say
        self.ran: list[str] = []

    def record_path(self, name: str) -> Path:
        return self.run / RunFolder.stage_rel(name)

    def why_stale(self, stage: Stage, sig: str, inputs: dict) -> str | None:
        """None when up to date, else the reason in words (`inputs`: the inputs' hashes now)."""
        path = self.record_path(stage.name)
        if not path.is_file():
            return "not run yet"
        try:
            rec = StageRecord.from_json(read_json(path))
        except ValueError as err:  # another release's record, or a damaged one: it cannot vouch for the outputs
            return f"its record {path.name} is not one this version reads ({type(err).__name__})"
        if rec.signature != sig:
            changed = _changes(rec.settings.to_json(), stage.settings)
            changed += [f"input {k} changed" for k in _differing(inputs, rec.inputs)]
            return "; ".join(changed) or "signature changed"
        outputs = hash_tree(self.run, stage.owns, stage.keep, stage.resume)
        # a record written before `resume` was declared lists the resume state too
        recorded = {k: v for k, v in rec.outputs.items() if not _skipped(k, stage.resume)}
        if outputs != recorded:
            bad = _differing(outputs, recorded)
            return "output(s) missing or modified: " + ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else "")
        return None

    def __call__(self, stage: Stage) -> bool:
        """Run `stage` if it is stale and selected; True when it ran (on every process alike)."""
        where = f"stage {stage.name}"
        plan = distributed.on_main(lambda: self._plan(stage), where)
        if plan is None:
            return False
        sig, inputs, missing = plan
        if missing:
            raise MissingFile(f"stage {stage.name} needs {', '.join(missing)} in {self.run}: run the stages "
                              "that write them first (drop --stages/--from)")
        started = distributed.on_main(lambda: self._prepare(stage, sig), where)
        summary = _spread(stage) if stage.spread else distributed.on_main(stage.run, where)
        if isinstance(summary, str) and distributed.is_main():
            self.say(summary)
        distributed.on_main(lambda: self._record(stage, sig, inputs, started), where)
        self.ran.append(stage.name)
        return True

    def _plan(self, stage: Stage) -> tuple[str, dict, list[str]] | None:
        """(signature, input hashes, missing inputs) when `stage` is to run, else None; says why."""
        inputs = hash_tree(self.run, stage.inputs, skip=stage.resume)
        missing = [k for k, v in inputs.items() if v is None]
        sig = signature(stage.settings, inputs)
        reason = "forced" if self.force else self.why_stale(stage, sig, inputs)
        chosen = self.selected is None or stage.name in self.selected or stage.group in self.selected
        if reason is None:
            self.say(f"[{stage.name}] up to date")
            return None
        if not chosen:
            self.say(f"[{stage.name}] stale ({reason}) but not selected; left as it is")
            return None
        if not (missing and not stage.partial):
            self.say(f"[{stage.name}] running ({reason})")
        return sig, inputs, [] if stage.partial else missing

    def _record(self, stage: Stage, sig: str, inputs: dict, started: float) -> None:
        record = StageRecord(stage=stage.name, signature=sig, settings=stage.settings, inputs=inputs,
                             outputs=hash_tree(self.run, stage.owns, stage.keep, stage.resume), versions=versions(),
                             seconds=round(time.perf_counter() - started, 3), machine=machine_record(),
                             finished=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        write_json(self.record_path(stage.name), record.to_json())
        self.record_path(stage.name).with_suffix(".started").unlink(missing_ok=True)

    def _prepare(self, stage: Stage, sig: str) -> float:
        """Keep partial work made with this signature (resume); clear anything else the stage owns.
        -> the time it starts (perf_counter)."""
        started = self.record_path(stage.name).with_suffix(".started")
        if started.is_file() and read_json(started) == {"signature": sig} and not self.force:
            self.say(f"[{stage.name}] resuming the interrupted run")
            return time.perf_counter()
        self.record_path(stage.name).unlink(missing_ok=True)
        for rel in stage.owns:
            _clear(self.run / rel, [self.run / k for k in stage.keep])
        write_json(started, {"signature": sig})
        return time.perf_counter()


def _spread(stage: Stage) -> object:
    """Every process runs the stage. One that fails says so and stops; its peers then fail in their
    next collective, or the launcher stops them (a peer may be inside a collective of the stage,
    where no message can reach it)."""
    try:
        return stage.run()
    except BaseException as err:
        if distributed.world() > 1:
            logger.error("[%s] failed on process %d of %d: %s: %s", stage.name, distributed.rank(),
                         distributed.world(), type(err).__name__, err)
        raise


def _clear(path: Path, keep: list[Path]) -> None:
    if path.is_file():
        path.unlink()
    elif path.is_dir():
        if not any(k.is_relative_to(path) for k in keep):
            shutil.rmtree(path)
            return
        for child in path.iterdir():
            if child in keep:
                continue
            _clear(child, keep)

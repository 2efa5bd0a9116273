"""Commit a study's run folder as a record: its small outputs, the commit and the command that made it.

    python -m studies.record RUN_FOLDER records/STUDY/TAG --command "keyheads run ..." [--commit SHA] \
        [--machine "2-core x86-64 CPU"] [--note "..."]

Each stage record names the commit of the keyheads checkout that ran it (`versions.commit`). The record's commit is
`--commit`, or, without it, the one commit all its stages name. A stage that names another commit (a long study
that went on under newer code) is listed in record.json's `stage_commits`, and its page says so; so is a stage
run from uncommitted changes (with a warning: no commit holds its code). `--commit` is needed for stages made
before stage records named their commit.

What a record keeps is keyheads.study.records' (the cells of a study keep the same): what the findings, tables
and pages are computed from, and nothing that is only derived or heavy (no weights, adapters, figures or benchmark
text). The record is then read through the run folder's typed readers, so a record that does not parse is refused
here, not later.

A run folder can be recorded while its run goes on: a stage that has started and not finished
(`stages/NAME.started` without `stages/NAME.json`) leaves its folder out, partial files and all, and record.json
lists the stages the record holds.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from keyheads.errors import UserError
from keyheads.report.html import render
from keyheads.runfolder import RunFolder
from keyheads.study.records import copy_kept, small_outputs, stages_of

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 25 * 2**20  # every record together


def stage_commits(run: Path, finished: list[str]) -> dict[str, str | None]:
    """stage -> the commit its stage record names (None for a record made before records named one)."""
    records = RunFolder(run).stage_records  # the typed reader the report uses
    return {name: records[name].versions.get("commit") for name in finished}


def record_commits(run: Path, finished: list[str], commit: str | None) -> tuple[str, dict[str, str]]:
    """(the record's commit, the stages that name another) from --commit and the stage records."""
    named = stage_commits(run, finished)
    dirty = sorted(s for s, c in named.items() if c and c.endswith("uncommitted changes"))
    if dirty:  # recorded as they are, and said: no commit holds their code
        print(f"warning: {run}: stage(s) {', '.join(dirty)} ran from uncommitted changes; to record them under a "
              "commit, commit the code and re-run them (keyheads run ... --stages NAME)", file=sys.stderr)
    if commit is None:
        known = {c for c in named.values() if c}
        if len(known) != 1 or None in named.values():
            unnamed = sorted(s for s, c in named.items() if not c)
            raise SystemExit(f"{run}: give --commit: " + (f"stage(s) {', '.join(unnamed)} name no commit"
                                                            if unnamed else f"the stages name {len(known)} commits"))
        commit = known.pop()
    return commit, {s: c for s, c in named.items() if c and c != commit}


def make_record(run: Path, dest: Path, commit: str | None, command: str, machine: str, note: str = "") -> Path:
    if not (run / "stages").is_dir():
        raise SystemExit(f"{run}: not a run folder (no stages/): give the --out of `keyheads run`")
    commit, others = record_commits(run, stages_of(run)[0], commit)
    if dest.exists():
        raise SystemExit(f"{dest} exists: a record is written once; give another TAG")
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    copy_kept(run, small_outputs(run), tmp / "run")
    finished, _ = stages_of(run)
    meta = {"study": dest.parent.name, "commit": commit, "command": command, "machine": machine, "note": note,
            "stages": finished}
    if others:
        meta["stage_commits"] = others
    (tmp / "record.json").write_text(json.dumps(meta, indent=1) + "\n")
    try:
        render(tmp / "run")  # every artifact through its typed reader, as the report and the findings read it
    except UserError as err:
        shutil.rmtree(tmp)
        raise SystemExit(f"{run}: not recorded, a file does not parse: {err}") from None
    tmp.rename(dest)
    total = sum(p.stat().st_size for p in (ROOT / "records").rglob("*") if p.is_file()) \
        if dest.is_relative_to(ROOT / "records") else 0
    if total > BUDGET:
        print(f"warning: records/ holds {total / 2**20:.1f} MB, over the {BUDGET / 2**20:.0f} MB budget",
              file=sys.stderr)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("dest", type=Path, help="records/STUDY/TAG")
    ap.add_argument("--commit", help="the commit whose code made the run (default: the one its stage records name)")
    ap.add_argument("--command", required=True, help="the command that made it")
    ap.add_argument("--machine", default="", help="where it ran")
    ap.add_argument("--note", default="")
    a = ap.parse_args(argv)
    dest = make_record(a.run, a.dest, a.commit, a.command, a.machine, a.note)
    print(f"{dest}: {len(small_outputs(dest / 'run'))} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

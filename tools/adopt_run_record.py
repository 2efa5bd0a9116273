"""Make a whole-run record's identify and analysis stages cells of a study, so that the study's other cells read its
pairs and key heads instead of patching again, and its analyses are not run twice:

    python tools/adopt_run_record.py configs/table1-gemma3.yaml records/table1-gemma3/2026-11-28-finetune

The record's data and identify stage records, and the files they wrote, become records/CONFIG-NAME/cells/identify
(with the run's config.json and model.json), as `keyheads study run --cell identify` would have written them; its
knockout, attention and mlp stages, where it has them, become those cells. Each cell's record says where it came
from. A cell is done only where the config's stage settings are the ones the record holds (`keyheads study status`
says so); nothing is computed or changed.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from keyheads.config.run import RunSettings
from keyheads.io import read_json, write_json
from keyheads.study.cells import _write_record, cells_of, status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="the study's YAML config")
    parser.add_argument("record", help="a whole-run record (records/NAME/DATE) whose run/ holds data and identify")
    parser.add_argument("--records", help="the study's cell records (default: records/CONFIG-NAME/cells)")
    parser.add_argument("--data-dir", help="the benchmark folder, as the study is run with")
    args = parser.parse_args(argv)
    record = Path(args.record)
    run = record / "run"
    if not (run / "stages" / "identify.json").is_file() or not (run / "stages" / "data.json").is_file():
        print(f"{record}: no run/stages/data.json and identify.json: not a record of a run's identify stage",
              file=sys.stderr)
        return 2
    cfg = RunSettings.from_yaml(args.config, **({"data_dir": args.data_dir} if args.data_dir else {}))
    records = Path(args.records) if args.records else Path("records") / Path(args.config).stem / "cells"
    cells = [c for c in cells_of(cfg) if c.name in ("identify", "knockout", "attention", "mlp")
             and all((run / "stages" / f"{stage}.json").is_file() for stage in c.stages)]
    meta = read_json(record / "record.json") if (record / "record.json").is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "run"
        shutil.copytree(run, work)
        for cell in cells:
            dest = _write_record(cfg, records, cell, work, command=meta.get("command", ""))
            made = read_json(dest / "record.json")
            # the code and commit are the original run's, not this checkout's: the record says so, unsigned
            made.pop("code", None)
            made.update({"commit": meta.get("commit"), "adopted_from": str(record)})
            write_json(dest / "record.json", made)
    states = {s.cell.name: s for s in status(cfg, records)}
    for cell in cells:
        print(f"{records / cell.slug}: {cell.name} {states[cell.name].state} ({states[cell.name].why})")
    return 0 if all(states[c.name].state == "done" for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())

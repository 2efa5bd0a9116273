"""A study as cells: units of a config's run that each commit their own record, so that a study advances cell by
cell across machines and jobs.

A cell is one of:
- `identify`: the data and identify stages (the pairs, effects and key heads every other cell reads);
- `identify/NAME`, `knockout`, `attention`, `mlp`: one analysis stage;
- `eval/base`, `eval/knockout`: one evaluation-only row of the table;
- `finetune/grid/FAMILY/LR`: one point of a learning-rate grid (finetune.lr_grid), scored on validation examples;
- `finetune/VARIANT`: one fine-tuned variant with its evaluation row (the adapter is not kept in a record, so the
  row is evaluated where it was trained), at its family's grid choice when it has a grid.

A cell's record, `RECORDS/CELL` (CELL's slashes as `--`), holds record.json and `run/`, the small outputs of its
stages as any record keeps them (keyheads.study.records) with their stage records. An evaluation row writes its
own table into `eval-rows/ROW/`, of that row alone: the base row is evaluated once, by `eval/base`, and another row's
generic KL is measured against the base model without evaluating it again. (Records made before 2026-11-29 hold the
base row too, evaluated again in every row's cell; `merge` takes each cell's own row, the last.)

A cell is done when its record's stage settings are the config's, the inputs it read are the outputs its
upstream cell's record holds and the code its stages compute with is the checkout's (keyheads.study.code; a record
from before cells were signed is taken as done, and says so); stale when any differs; pending without a record.
`run_cell` runs one in its own work folder (`OUT/cells/CELL`, so a killed cell resumes from its checkpoints there),
with its upstream cells' files restored from their records and checked against the hashes their stage records give,
and then writes its record (atomically: a new record replaces a stale one whole). `merge` lays every record into one
run folder that the findings, tables and pages read like any run's.
"""
from __future__ import annotations

import json
import resource
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..config.run import RunSettings
from ..errors import BadFile, SettingError
from ..io import file_sha256, read_json, write_json
from ..log import logger
from ..pipeline import ROWS, build_stages, evaluate_rows, load_run_model, rate_elsewhere, rate_family, write_model_info
from ..provenance import changed_settings, code_commit
from ..results.evaluation import EvalResults, VariantResult
from ..results.run import CellRecord, StageRecord
from ..runfolder import RunFolder, read_result, variant_slug
from ..stages import Runner, Stage
from . import code
from .records import copy_kept, small_outputs

ROW_FOLDER = "eval-rows"
# settings that say where, not what: a cell made with the data folder at another path is the same cell
WHERE = ("data_dir", "out")
STATES = ("done", "stale", "pending", "waiting")


@dataclass(frozen=True)
class Cell:
    name: str
    stages: tuple[str, ...]  # the pipeline stages it runs, in order
    after: tuple[str, ...] = ("identify",)  # the cells whose outputs it reads

    @property
    def slug(self) -> str:
        return self.name.replace("/", "--")


@dataclass(frozen=True)
class CellState:
    cell: Cell
    state: str           # done | stale | pending | waiting (on another study: finetune.lr_from)
    why: str             # what is stale, or where the record is
    seconds: float | None  # its time: measured (done, stale) or estimated from the study's other cells


def cells_of(cfg: RunSettings) -> list[Cell]:
    """Every cell of the config, in the order the pipeline runs its stages."""
    names = [s.name for s in plan(cfg, Path(cfg.out))]
    out = [Cell("identify", ("data", "identify"), after=())]
    out += [Cell(n, (n,)) for n in names if n.startswith("identify/") or n in ("knockout", "attention", "mlp")]
    if cfg.eval.benchmarks:
        out += [Cell(f"eval/{row}", (f"eval/{row}",)) for row in ROWS]
    grid = [n for n in names if n.startswith("finetune/grid/")]
    out += [Cell(n, (n,)) for n in grid]
    for n in names:
        if n.startswith("finetune/") and n not in grid:
            variant = n.split("/", 1)[1]
            rates = [g for g in grid if g.startswith(f"finetune/grid/{rate_family(variant)}/")]
            out.append(Cell(n, (n, *((f"eval/{variant}",) if cfg.eval.benchmarks else ())), ("identify", *rates)))
    return out


def plan(cfg: RunSettings, work: Path, get_model: Callable = lambda: None, progress: bool = False) -> list[Stage]:
    """The pipeline's stages without its whole-table eval and the report, and one stage per evaluation row."""
    stages = [s for s in build_stages(cfg, work, get_model, progress) if s.group not in ("eval", "report")]
    if not cfg.eval.benchmarks:
        return stages
    run = RunFolder(work)
    model_key = {"model": cfg.model, "dtype": cfg.dtype}
    section = {**model_key, **cfg.eval.to_json(), "mean": cfg.knockout.mean, "data_dir": cfg.data_dir}
    for row in [*ROWS, *cfg.variants]:
        folder = f"{ROW_FOLDER}/{variant_slug(row)}"
        inputs = [RunFolder.PAIRS, RunFolder.KEY_HEADS] + ([RunFolder.finetune_rel(row)] if row not in ROWS else [])

        def evaluate(row: str = row, folder: str = folder) -> None:
            # the base row is eval/base's cell alone; another row's drift is measured against the base model
            evaluate_rows(cfg, run, get_model(), [row], work / folder, work / folder / "cache", progress,
                          drift_from_base=row != "base")

        stages.append(Stage(f"eval/{row}", {**section, "row": row}, inputs, [folder], evaluate,
                            keep=[f"{folder}/cache"], spread=True))
    return stages


def _settings(stage: Stage) -> dict:
    return json.loads(json.dumps(stage.settings))  # as a stage record holds them


def cell_record(folder: Path) -> CellRecord | None:
    """A cell record's record.json, as its type (None when it has none)."""
    return read_result(folder / "record.json", CellRecord.from_json)


def _record_stages(folder: Path) -> dict[str, StageRecord]:
    return RunFolder(folder / "run").stage_records if (folder / "run").is_dir() else {}


def status(cfg: RunSettings, records: Path) -> list[CellState]:
    """Each cell of the config: done, stale (and why) or pending, with its measured or estimated seconds."""
    stages = {s.name: s for s in plan(cfg, Path(cfg.out))}
    cells = cells_of(cfg)
    made = {c.name: _record_stages(records / c.slug) for c in cells}
    out = []
    for cell in cells:
        recs = made[cell.name]
        if not recs:
            waits = _waits_for(cfg, cell)
            out.append(CellState(cell, "waiting" if waits else "pending", waits or "no record", None))
            continue
        why = []
        for name in cell.stages:
            if name not in recs:
                why.append(f"{name} not in its record")
                continue
            changed = changed_settings(recs[name].settings.to_json(), _settings(stages[name]), skip=WHERE)
            why += [f"{k} {a!r} -> {b!r}" for k, a, b in changed]
            for rel, sha in recs[name].inputs.items():  # what it read against what its upstream cells hold now
                held = [made[u][s].outputs[rel] for u in cell.after for s in made[u] if rel in made[u][s].outputs]
                if held and sha not in held:
                    why.append(f"input {rel} changed")
        where = str(records / cell.slug)
        meta = cell_record(records / cell.slug)
        if meta is not None and meta.code is not None:
            moved = code.changed(meta.code, code.signature(cell.stages))
            if moved:
                why.append(f"code changed: {', '.join(moved[:3])}" + (f" and {len(moved) - 3} more" if len(moved) > 3
                                                                      else ""))
            elif meta.resigned:
                where += f" (re-signed at {meta.resigned[-1].now[:7]} by a witness)"
        else:
            where += " (no code signature: recorded before cells kept one)"
        seconds = sum(r.seconds for r in recs.values())
        out.append(CellState(cell, "stale" if why else "done", "; ".join(why) or where, seconds))
    elsewhere = cache(lambda kind: _elsewhere(cfg, records, kind))  # the other studies' records, read once a kind
    return [_estimated(s, out, elsewhere) for s in out]


def _waits_for(cfg: RunSettings, cell: Cell) -> str | None:
    """What a cell with no record waits for outside its study: another study's grid that chooses its rate (lr_from)."""
    for name in cell.stages:
        if name.startswith("finetune/") and not name.startswith("finetune/grid/"):
            rate = rate_elsewhere(cfg, name.removeprefix("finetune/"))
            if rate is not None and rate.lr is None:
                return f"waits for the rate {rate.config} chooses for {rate.family} (its grid is not complete)"
    return None


def _kind(name: str) -> str:
    return "finetune/grid" if name.startswith("finetune/grid/") else name.split("/", 1)[0]


def _estimated(state: CellState, states: list[CellState], elsewhere: Callable[[str], float | None]) -> CellState:
    """A pending cell's time: the median of the study's measured cells of its kind (a grid point, a fine-tuned
    variant, an evaluation row, ...); with none, what the other studies' cells of its kind took, scaled to this
    model's size (`elsewhere`)."""
    if state.seconds is not None:
        return state
    like = [s.seconds for s in states if s.seconds is not None and _kind(s.cell.name) == _kind(state.cell.name)]
    return CellState(state.cell, state.state, state.why,
                     statistics.median(like) if like else elsewhere(_kind(state.cell.name)))


@cache
def _params(model: str) -> int | None:
    """A model's parameter count from its config alone (None when it cannot be read here)."""
    from ..planning.shape import load_config, shape_of  # noqa: PLC0415 -- reads a config, loads no weights

    try:
        return shape_of(load_config(model), model).params
    except Exception:  # noqa: BLE001 -- an estimate is a nicety: a model not on this machine gives none
        return None


def _elsewhere(cfg: RunSettings, records: Path, kind: str) -> float | None:
    """The median seconds of every other study's committed cells of `kind`, each scaled by this model's parameters
    over its model's: a rough first estimate for a study with no cell of that kind yet (it ignores data sizes)."""
    mine = _params(cfg.model)
    if mine is None:
        return None
    scaled = []
    for folder in sorted(records.parent.parent.glob("*/cells/*/record.json")):
        meta = cell_record(folder.parent)
        if meta is None or folder.parent.parent == records or _kind(meta.cell) != kind:
            continue
        theirs = _params(meta.model)
        seconds = meta.seconds_or(_record_stages(folder.parent))
        if theirs and seconds:
            scaled.append(seconds * mine / theirs)
    return statistics.median(scaled) if scaled else None


CODE_JSON = "cell-code.json"  # in a cell's work folder: the code signature its outputs and checkpoints were made with


def _restore(records: Path, cell_names: list[str], work: Path) -> None:
    """Copy the named cells' recorded files into `work`, each checked against the hash its stage record gives."""
    for name in cell_names:
        rec = records / name.replace("/", "--") / "run"
        outputs = {k: v for r in _record_stages(records / name.replace("/", "--")).values()
                   for k, v in r.outputs.items()}
        for path in sorted(rec.rglob("*")):
            if not path.is_file():
                continue
            rel = path.relative_to(rec).as_posix()
            if rel in outputs and rel != "knockout/knockout.json" and not rel.endswith(".wrong.jsonl") \
                    and outputs[rel] != file_sha256(path):
                raise BadFile(f"{path}: its bytes are not the ones its stage record names; a record is written "
                              "once: restore it from git (git checkout -- records/)")
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, work / rel)


def run_cell(cfg: RunSettings, records: Path, name: str, say: Callable[[str], None] = logger.info,
             progress: bool = True, command: str = "") -> Path:
    """Run cell `name` of `cfg` and write its record into `records`; -> the record's folder."""
    cells = {c.name: c for c in cells_of(cfg)}
    if name not in cells:
        raise SettingError(f"no cell {name!r} in this config; its cells: {', '.join(cells)}")
    cell = cells[name]
    states = {s.cell.name: s for s in status(cfg, records)}
    missing = [u for u in cell.after if states[u].state != "done"]
    if missing:
        raise SettingError(f"cell {name} reads what {', '.join(missing)} write, which is not done here: run it first "
                           f"(keyheads study run CONFIG --cell {missing[0]})")
    work = Path(cfg.out) / "cells" / cell.slug
    signature = code.signature(cell.stages)
    made_by = work / CODE_JSON
    if work.exists() and (not made_by.is_file() or read_json(made_by) != signature):
        # outputs and checkpoints that other code computed (or code not known) must not become a record of this code
        say(f"{work} was made by other code than this checkout's: cell {name} starts again there")
        shutil.rmtree(work)
    _restore(records, list(cell.after), work)
    write_json(made_by, signature)
    cfg = cfg.model_copy(update={"out": str(work)})
    write_json(work / "config.json", cfg.to_json())

    @cache
    def get_model():  # loaded on first use, as the run loads and places it
        model = load_run_model(cfg)
        write_model_info(RunFolder(work), model)
        return model

    wall, cpu = time.perf_counter(), _cpu_seconds()
    runner = Runner(work, set(cell.stages), say=say)
    for stage in plan(cfg, work, get_model, progress):
        if stage.name in cell.stages:
            runner(stage)
    spent = {"wall_seconds": round(time.perf_counter() - wall, 1), "cpu_seconds": round(_cpu_seconds() - cpu, 1)}
    return _write_record(cfg, records, cell, work, command, spent)


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children, every thread counted (a cell's cost on any machine,
    where its wall time depends on the cores it had)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def _write_record(cfg: RunSettings, records: Path, cell: Cell, work: Path, command: str,
                  spent: dict | None = None) -> Path:
    owned = [o for s in plan(cfg, work) if s.name in cell.stages for o in s.owns]
    if cell.name == "identify":  # the run's config and model facts travel with its first cell
        owned += [RunFolder.CONFIG, RunFolder.MODEL]
    rels = small_outputs(work, [*owned, *(RunFolder.stage_rel(n) for n in cell.stages)])
    dest = records / cell.slug
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    copy_kept(work, rels, tmp / "run")
    write_json(tmp / "record.json", CellRecord(cell=cell.name, model=cfg.model, command=command,
                                               commit=code_commit(), stages=list(cell.stages),
                                               code=_made_with(work, cell), **(spent or {})).to_json())
    if dest.exists():  # a stale record: replaced whole
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def _made_with(work: Path, cell: Cell) -> dict[str, str]:
    """The code signature the cell's work folder was made with (the checkout's when it says none)."""
    return read_json(work / CODE_JSON) if (work / CODE_JSON).is_file() else code.signature(cell.stages)


def is_cells(folder: Path) -> bool:
    """Whether `folder` holds cell records (a study's `records/NAME/cells`), not one run's record."""
    return folder.is_dir() and not (folder / "run").is_dir() and any(folder.glob("*/record.json"))


def merge(records: Path, dest: Path, cfg: RunSettings | None = None) -> RunFolder:
    """Every cell record under `records` laid into one run folder `dest`, its evaluation rows joined into one table
    (base, knockout, then the variants in the order of `cfg`, else of the recorded config, then any other row)."""
    if dest.exists():
        shutil.rmtree(dest)
    folders = sorted(p for p in records.iterdir() if (p / "record.json").is_file()) if records.is_dir() else []
    rows: dict[str, VariantResult] = {}
    config = None
    for folder in folders:
        meta = cell_record(folder)
        assert meta is not None  # the folders were chosen by their record.json
        for path in sorted((folder / "run").rglob("*")):
            rel = path.relative_to(folder / "run")
            if path.is_file() and rel.parts[0] != ROW_FOLDER:
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest / rel)
        if meta.cell.startswith(("eval/", "finetune/")) and (folder / "run" / ROW_FOLDER).is_dir():
            row = meta.cell.split("/", 1)[1]
            tables = sorted((folder / "run" / ROW_FOLDER).glob("*/results.json"))
            if len(tables) != 1:
                raise BadFile(f"{folder / 'run' / ROW_FOLDER} holds {len(tables)} evaluation tables "
                              "(*/results.json), not the one its cell writes: restore the cell record from git "
                              "(git checkout -- records/)")
            [table] = tables
            data = read_result(table, EvalResults.from_json)
            assert data is not None
            config = config or data.config
            mine = data.variants[-1]  # the row itself; the base row before it is its reference
            rows[row] = mine
            src = table.parent / variant_slug(mine.label)
            shutil.copytree(src, dest / "eval" / src.name, dirs_exist_ok=True)
    if rows:
        recorded = RunFolder(dest).config_record
        listed = cfg.variants if cfg is not None else (recorded.variants if recorded is not None else None) or []
        # a row no config lists (an adopted config older than the cell) is still a measured row: kept last, sorted
        order = [*ROWS, *listed, *sorted(set(rows) - set(ROWS) - set(listed))]
        merged = EvalResults(config=config, variants=[rows[r] for r in order if r in rows])
        write_json(dest / "eval" / "results.json", merged.to_json())
    return RunFolder(dest)


"""The run folder, the interface between the stages: every path of a run, and one reader of each artifact.

    RUN/
      config.json              config        the effective settings (itself a valid config)
      model.json               model_info    what was loaded: name, source, fingerprint, shape
      pairs.jsonl              pairs         the prompt pairs (data)
      identify/                identify      effects.json, key_heads.json, effects.csv, heatmap.png
      identify/NAME/           also_identify(name)  pairs.jsonl and the same files, on one more set (also_identify)
      knockout/                knockout      knockout.json, knockout_curves.csv/.png, transfer.csv
      attention/               attention     attention.json, attention_by_role.csv, figures
      mlp/                     mlp           mlp.json, mlp_curves.csv, figures
      finetune/VARIANT/        finetune(v)   finetune.json, adapter.safetensors (or the model)
      eval/                    eval          results.json, the per-item cache/
      eval/VARIANT/            eval_variant(label)  BENCH.json, BENCH.wrong.jsonl (wrong_ids: the items it got wrong)
      stages/STAGE.json        stage_record  what each stage ran with (keyheads.stages)
      report.html              report

A step run on its own (`keyheads knockout --out DIR`) writes the same file names into its folder; they are
the constants below. Nothing here imports torch: a run folder copied to a laptop is read there too.
"""
from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path
from typing import Any

from .io import read_jsonl
from .mean import upgraded

# the files a step writes into its own folder
EFFECTS_JSON = "effects.json"
KEY_HEADS_JSON = "key_heads.json"
KNOCKOUT_JSON = "knockout.json"
ATTENTION_JSON = "attention.json"
MLP_JSON = "mlp.json"
FINETUNE_JSON = "finetune.json"
RESULTS_JSON = "results.json"
WRONG_JSONL = ".wrong.jsonl"  # <benchmark>.wrong.jsonl: the items a variant got wrong, one JSON object each


def variant_slug(label: str) -> str:
    """The folder name of an evaluated row under eval/ (the evaluator names it so: evaluation.runner.slug)."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", label).strip("_") or "model"


def read_record(path: Path) -> Any:
    """The JSON at `path`, or None when it was not written (or is unreadable): what a reader of a run that
    may be partial wants. Inputs a command is given are read with keyheads.io.read_json, which raises."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class RunFolder:
    """The paths of one run folder (`root`), and its artifacts, each read once."""

    # run-relative names, as stage records and stage inputs/outputs use them
    CONFIG = "config.json"
    MODEL = "model.json"
    PAIRS = "pairs.jsonl"
    IDENTIFY = "identify"
    EFFECTS = f"{IDENTIFY}/{EFFECTS_JSON}"
    KEY_HEADS = f"{IDENTIFY}/{KEY_HEADS_JSON}"
    KNOCKOUT = "knockout"
    ATTENTION = "attention"
    MLP = "mlp"
    FINETUNE = "finetune"
    EVAL = "eval"
    EVAL_RESULTS = f"{EVAL}/{RESULTS_JSON}"
    EVAL_CACHE = f"{EVAL}/cache"
    STAGES = "stages"
    REPORT = "report.html"

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @classmethod
    def of(cls, folder: str | Path | RunFolder) -> RunFolder:
        """`folder` as a RunFolder (a path is read afresh; a RunFolder keeps what it has read)."""
        return folder if isinstance(folder, RunFolder) else cls(folder)

    def __truediv__(self, rel: str) -> Path:
        return self.root / rel

    def __fspath__(self) -> str:  # a RunFolder is the folder's path wherever a path is taken
        return str(self.root)

    def __str__(self) -> str:
        return str(self.root)

    # ---- paths ------------------------------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.root / self.CONFIG

    @property
    def model_info(self) -> Path:
        return self.root / self.MODEL

    @property
    def pairs(self) -> Path:
        return self.root / self.PAIRS

    @property
    def identify(self) -> Path:
        return self.root / self.IDENTIFY

    @property
    def effects(self) -> Path:
        return self.root / self.EFFECTS

    @property
    def key_heads(self) -> Path:
        return self.root / self.KEY_HEADS

    @staticmethod
    def also_identify_rel(name: str) -> str:
        """identify/NAME: the identification on one more set of pairs (a run's also_identify)."""
        return f"{RunFolder.IDENTIFY}/{name}"

    def also_identify(self, name: str) -> Path:
        return self.root / self.also_identify_rel(name)

    def also_identify_pairs(self, name: str) -> Path:
        return self.also_identify(name) / self.PAIRS

    @property
    def knockout(self) -> Path:
        return self.root / self.KNOCKOUT

    @property
    def attention(self) -> Path:
        return self.root / self.ATTENTION

    @property
    def mlp(self) -> Path:
        return self.root / self.MLP

    @staticmethod
    def finetune_rel(variant: str) -> str:
        return f"{RunFolder.FINETUNE}/{variant}"

    def finetune(self, variant: str) -> Path:
        return self.root / self.finetune_rel(variant)

    @property
    def eval(self) -> Path:
        return self.root / self.EVAL

    @property
    def eval_cache(self) -> Path:
        return self.root / self.EVAL_CACHE

    def eval_variant(self, label: str) -> Path:
        """eval/<row>/: the benchmarks' summaries and wrong cases of the evaluated row `label`."""
        return self.root / self.EVAL / variant_slug(label)

    def eval_wrong(self, label: str, benchmark: str) -> Path:
        return self.eval_variant(label) / f"{benchmark}{WRONG_JSONL}"

    def wrong_ids(self, label: str, benchmark: str) -> set[str] | None:
        """The ids of the items row `label` got wrong on `benchmark`; None when the file was not written
        (or is unreadable). Every other item of the benchmark's n was answered right."""
        try:
            return {str(row["id"]) for row in read_jsonl(self.eval_wrong(label, benchmark))}
        except (OSError, ValueError, KeyError):  # not written, not JSONL (keyheads.io's errors), no ids
            return None

    @property
    def stages(self) -> Path:
        return self.root / self.STAGES

    @staticmethod
    def stage_rel(name: str) -> str:
        """The record of stage `name` ("finetune/precise" -> stages/finetune--precise.json)."""
        return f"{RunFolder.STAGES}/{name.replace('/', '--')}.json"

    @property
    def report(self) -> Path:
        return self.root / self.REPORT

    # ---- artifacts, each read once (None: not written) -------------------------------------------------
    @cached_property
    def config_record(self) -> Any:
        return read_record(self.config)

    @cached_property
    def model_record(self) -> Any:
        return read_record(self.model_info)

    @cached_property
    def effects_record(self) -> Any:
        return read_record(self.effects)

    @cached_property
    def key_heads_record(self) -> Any:
        return read_record(self.key_heads)

    @cached_property
    def also_identify_records(self) -> dict[str, dict]:
        """{name: {"effects": effects.json, "key_heads": key_heads.json}} of every finished identify/NAME, by name."""
        out = {}
        for path in sorted(self.identify.glob(f"*/{KEY_HEADS_JSON}")):
            keys, effects = read_record(path), read_record(path.parent / EFFECTS_JSON)
            if isinstance(keys, dict) and isinstance(effects, dict):
                out[path.parent.name] = {"effects": effects, "key_heads": keys}
        return out

    @cached_property
    def knockout_record(self) -> Any:
        return upgraded(read_record(self.knockout / KNOCKOUT_JSON))

    @cached_property
    def attention_record(self) -> Any:
        return read_record(self.attention / ATTENTION_JSON)

    @cached_property
    def mlp_record(self) -> Any:
        return read_record(self.mlp / MLP_JSON)

    @cached_property
    def eval_record(self) -> Any:
        return upgraded(read_record(self.root / self.EVAL_RESULTS))

    @cached_property
    def finetune_records(self) -> dict[str, dict]:
        """{variant: finetune.json} of every finished fine-tuning run, by name."""
        out = {}
        for path in sorted((self.root / self.FINETUNE).glob(f"*/{FINETUNE_JSON}")):
            info = read_record(path)
            if isinstance(info, dict):
                out[path.parent.name] = info
        return out

    @cached_property
    def stage_records(self) -> dict[str, dict]:
        """{stage name: its stages/STAGE.json record}, in the order the stages finished."""
        records = {}
        for path in self.stages.glob("*.json"):
            rec = read_record(path)
            if isinstance(rec, dict):
                records[str(rec.get("stage") or path.stem)] = rec
        return dict(sorted(records.items(), key=lambda kv: str(kv[1].get("finished") or "")))

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
the constants below. Each artifact is read as its type (keyheads.results, keyheads.effects), None when it was
not written; a file that is there but does not read as its type is a BadFile that names it and says what is
wrong, never a None. Nothing here imports torch: a run folder copied to a laptop is read there too.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from .effects import Effects
from .errors import BadFile
from .io import read_json, read_jsonl
from .results.attention import AttentionResult
from .results.base import problems
from .results.evaluation import EvalResults
from .results.finetune import FinetuneResult
from .results.identify import Identification, KeyHeads
from .results.knockout import KnockoutResult
from .results.mlp import MLPResult
from .results.run import ModelInfo, SavedConfig, StageRecord

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


T = TypeVar("T")


# what a record that does not parse may be, and what to do
OLDER = ("it was written by another version of keyheads, or changed since; run its stage again (a run folder saved "
         "before the knockout mean was named `mean` converts with `python tools/upgrade_run_folder.py FOLDER` from "
         "keyheads' source tree)")


def read_result(path: Path, read: Callable[[Any], T]) -> T | None:
    """The artifact at `path` read by `read` (its type's from_json), or None when it was not written. A file that
    is there but is not JSON, or not of its type's shape, is a BadFile naming it and what is wrong: an old or
    damaged record fails where it is read, not as a section that says the stage did not run."""
    if not path.is_file():
        return None
    data = read_json(path)
    try:
        return read(data)
    except ValidationError as err:
        raise BadFile(f"{path} is not the record keyheads reads there ({problems(err)}): {OLDER}") from None
    except (ValueError, TypeError, KeyError) as err:
        raise BadFile(f"{path} is not the record keyheads reads there ({err}): {OLDER}") from None


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
        """The ids of the items row `label` got wrong on `benchmark`; None when the file was not written, a
        BadFile when a line is not JSON or has no id. Every other item of the benchmark's n was answered right."""
        path = self.eval_wrong(label, benchmark)
        if not path.is_file():
            return None
        rows = read_jsonl(path)  # a line that is not a JSON object: MalformedLine, a BadFile
        missing = next((i for i, row in enumerate(rows, start=1) if "id" not in row), None)
        if missing is not None:
            raise BadFile(f"{path}: item {missing} has no 'id': it is not the wrong items the evaluator writes")
        return {str(row["id"]) for row in rows}

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

    # ---- artifacts, each read once (None: not written; BadFile: there but not of its type) ----------------
    @cached_property
    def config_record(self) -> SavedConfig | None:
        """config.json: the effective settings, in the YAML's keys."""
        return read_result(self.config, SavedConfig.from_json)

    @cached_property
    def model_record(self) -> ModelInfo | None:
        return read_result(self.model_info, ModelInfo.from_json)

    @cached_property
    def effects_record(self) -> Effects | None:
        return read_result(self.effects, Effects.from_json)

    @cached_property
    def key_heads_record(self) -> KeyHeads | None:
        return read_result(self.key_heads, KeyHeads.from_json)

    @cached_property
    def also_identify_records(self) -> dict[str, Identification]:
        """{name: its effects and key heads} of every finished identify/NAME (both files written), by name."""
        out = {}
        for path in sorted(self.identify.glob(f"*/{KEY_HEADS_JSON}")):
            keys = read_result(path, KeyHeads.from_json)
            effects = read_result(path.parent / EFFECTS_JSON, Effects.from_json)
            if keys is not None and effects is not None:
                out[path.parent.name] = Identification(effects, keys)
        return out

    @cached_property
    def knockout_record(self) -> KnockoutResult | None:
        return read_result(self.knockout / KNOCKOUT_JSON, KnockoutResult.from_json)

    @cached_property
    def attention_record(self) -> AttentionResult | None:
        return read_result(self.attention / ATTENTION_JSON, AttentionResult.from_json)

    @cached_property
    def mlp_record(self) -> MLPResult | None:
        return read_result(self.mlp / MLP_JSON, MLPResult.from_json)

    @cached_property
    def eval_record(self) -> EvalResults | None:
        return read_result(self.root / self.EVAL_RESULTS, EvalResults.from_json)

    @cached_property
    def finetune_records(self) -> dict[str, FinetuneResult]:
        """{variant: its finetune.json} of every finished fine-tuning run, by name."""
        out = {}
        for path in sorted((self.root / self.FINETUNE).glob(f"*/{FINETUNE_JSON}")):
            info = read_result(path, FinetuneResult.from_json)
            if info is not None:
                out[path.parent.name] = info
        return out

    @cached_property
    def stage_records(self) -> dict[str, StageRecord]:
        """{stage name: its stages/STAGE.json record}, in the order the stages finished."""
        records = {}
        for path in self.stages.glob("*.json"):
            rec = read_result(path, StageRecord.from_json)
            if rec is not None:
                records[rec.stage] = rec
        return dict(sorted(records.items(), key=lambda kv: kv[1].finished))

    def read_all(self) -> dict[str, Any]:
        """Every artifact this folder has, read as its type (what a check that a run folder still reads calls):
        {reader name: what it returned}; raises BadFile at the first that does not read."""
        names = ("config_record", "model_record", "effects_record", "key_heads_record", "also_identify_records",
                 "knockout_record", "attention_record", "mlp_record", "eval_record", "finetune_records",
                 "stage_records")
        return {name: getattr(self, name) for name in names}

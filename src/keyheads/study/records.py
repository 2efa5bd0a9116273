"""What a committed record keeps of a run folder: its small outputs, never weights, figures or benchmark text.

A record holds what the findings, tables and pages are computed from, and nothing that is only derived or heavy:
stage records, config, model facts, pairs, effects, key heads, knockout curves and transfer, attention and MLP
summaries, each fine-tuned variant's summary (loss curve, speed, components), the evaluation's table, per-benchmark
summaries and per-item outcomes (*.wrong.jsonl: each item's id and the model's answer). The benchmarks' own text
stays in the data folder it came from: questions, choices and gold answers are cut from the items, and the pairs
made from GSM8K questions (identify/gsm8k/pairs.jsonl) and the transfer sets' example cases (prompts from SVAMP and
GSM8K) are left out. Left out too: weights, adapters, checkpoints, tokenizer files, figures, the report page,
per-sample arrays and the evaluation's answer cache.

studies/record.py records a whole run folder; keyheads.study.cells records one cell of a study.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

KEEP = {".json", ".jsonl", ".csv", ".md", ".txt"}
SKIP_DIRS = {"model", "cache", "checkpoints", "tokenizer"}  # weights, the answer cache, training checkpoints
SKIP_PATHS = ("identify/gsm8k/pairs.jsonl", "knockout/transfer_cases.txt")  # benchmark text (see above)
SKIP_FILES = ("tokenizer", "special_tokens_map", "adapter_config", "generation_config", "chat_template")
ITEM_KEYS = ("id", "pred", "how", "finish", "output", "scores")  # what a wrong item keeps: no benchmark text


def item_outcomes(text: str) -> str:
    """A *.wrong.jsonl with each item cut to ITEM_KEYS."""
    rows = (json.loads(line) for line in text.splitlines() if line.strip())
    return "".join(json.dumps({k: row[k] for k in ITEM_KEYS if k in row}, ensure_ascii=False) + "\n" for row in rows)


def without_cases(text: str) -> str:
    """knockout.json with its transfer sets' example cases cut (their prompts are benchmark questions)."""
    data = json.loads(text)
    if "transfer" in data and isinstance(data["transfer"], dict):
        data["transfer"]["cases"] = []
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def stage_name(path: Path) -> str:
    """stages/finetune--precise.json -> finetune/precise."""
    return path.stem.replace("--", "/")


def stages_of(run: Path) -> tuple[list[str], list[str]]:
    """(finished stages, stages started and not finished) of a run folder, by name ("finetune/precise")."""
    finished = sorted(stage_name(p) for p in (run / "stages").glob("*.json"))
    running = sorted(stage_name(p) for p in (run / "stages").glob("*.started") if stage_name(p) not in finished)
    return finished, running


def kept(rel: Path) -> bool:
    """Whether a record keeps the run-relative file `rel`."""
    return (rel.suffix in KEEP and not any(part in SKIP_DIRS for part in rel.parts[:-1])
            and not rel.name.startswith(SKIP_FILES) and not any(p.startswith("checkpoint") for p in rel.parts)
            and not rel.as_posix().startswith(SKIP_PATHS))


def small_outputs(run: Path, under: Iterable[str] | None = None) -> list[Path]:
    """The files of `run` a record keeps, relative to it (only those under the run-relative paths `under`, when
    given): none of a stage that is still running."""
    _, running = stages_of(run)
    roots = None if under is None else [u.rstrip("/") for u in under]
    out = []
    for path in sorted(run.rglob("*")):
        rel = path.relative_to(run)
        posix = rel.as_posix()
        if not path.is_file() or not kept(rel):
            continue
        if any(posix == stage or posix.startswith(stage + "/") for stage in running):
            continue
        if roots is not None and not any(posix == r or posix.startswith(r + "/") for r in roots):
            continue
        out.append(rel)
    return out


def copy_kept(run: Path, rels: Iterable[Path], dest_run: Path) -> None:
    """Copy the files `rels` of `run` into `dest_run`, item outcomes and knockout cases cut as a record keeps them."""
    for rel in rels:
        (dest_run / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel.name.endswith(".wrong.jsonl"):
            (dest_run / rel).write_text(item_outcomes((run / rel).read_text()))
        elif rel.as_posix().endswith("knockout/knockout.json"):
            (dest_run / rel).write_text(without_cases((run / rel).read_text()))
        else:
            shutil.copy2(run / rel, dest_run / rel)

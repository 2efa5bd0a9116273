"""The fine-tuning set: "all training data from four mathematical datasets", built clean.

GSM8K has a train split; AddSub, SingleEq and SVAMP do not, and MAWPS contains most of
AddSub and SingleEq. So the training set is GSM8K train plus a seeded held-out part of
AddSub, SingleEq and SVAMP; the rest of those three is what evaluation uses
(``heldout_splits``). AddSub and SingleEq share 126 questions (111 verbatim, 15 more that
differ only in thousands separators): the split is drawn over their union of distinct
questions, so a shared question falls on the same side in both.
The builder writes a manifest naming the seed, fraction and sizes, and checks the result
against everything that is evaluated.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field

from ..io import write_json, write_jsonl
from ..log import configure as configure_log
from ..log import logger
from ..numbers import format_number
from ..section import Section
from .benchmarks import Record, data_dir_from, load, question_key

HELDOUT = ("addsub", "singleeq", "svamp")


class SplitSettings(Section):
    """How the three test-only math sets are divided: the training set's split, which `--split heldout`
    evaluates the other side of (the same seed and fraction)."""

    model_config = ConfigDict(frozen=True)  # a default argument below: never changed in place

    seed: int = Field(0, ge=0, description="seeds the shuffle of distinct questions")
    train_fraction: float = Field(0.3, ge=0.0, lt=1.0, description="share of distinct questions that goes to "
                                                                    "training; the rest is evaluated")

    def tag(self) -> str:
        return f"seed{self.seed}-train{self.train_fraction:g}"


DEFAULT_SPLIT = SplitSettings()  # the training set's split unless one is given


def _train_keys(keys: set[str], cfg: SplitSettings) -> set[str]:
    ordered = sorted(keys)
    random.Random(cfg.seed).shuffle(ordered)
    return set(ordered[: round(len(ordered) * cfg.train_fraction)])


def heldout_splits(data_dir: str | Path | None = None, cfg: SplitSettings = DEFAULT_SPLIT
                   ) -> dict[str, tuple[list[Record], list[Record]]]:
    """name -> (train part, evaluated part) for addsub, singleeq and svamp."""
    data = {name: load(name, data_dir=data_dir) for name in HELDOUT}
    # AddSub and SingleEq overlap, so they are split together over their distinct questions.
    joint = {question_key(r.question) for name in ("addsub", "singleeq") for r in data[name]}
    train_keys = _train_keys(joint, cfg) | _train_keys({question_key(r.question) for r in data["svamp"]}, cfg)
    out = {}
    for name, records in data.items():
        train = [r for r in records if question_key(r.question) in train_keys]
        held = [r for r in records if question_key(r.question) not in train_keys]
        out[name] = (train, held)
    return out


def evaluated_sets(data_dir: str | Path | None = None, cfg: SplitSettings = DEFAULT_SPLIT) -> dict[str, list[Record]]:
    """What evaluation reads after fine-tuning on this set: GSM8K test and the held-out parts."""
    out = {"gsm8k": load("gsm8k", "test", data_dir=data_dir)}
    out.update({name: held for name, (_, held) in heldout_splits(data_dir, cfg).items()})
    return out


def target_text(record: Record) -> str:
    """The completion to train on, in the evaluation prompt's format (rationale, then the answer)."""
    answer = format_number(record.numeric_answer())
    if record.source.startswith("gsm8k") and record.solution:
        return " ".join(record.solution.split("\n")) + f" The answer is {answer}."
    return f"The answer is {answer}."


def build_trainset(data_dir: str | Path | None = None, cfg: SplitSettings = DEFAULT_SPLIT
                   ) -> tuple[list[dict], dict]:
    """GSM8K train plus the seeded held-out parts of AddSub, SingleEq and SVAMP, deduplicated and
    cleaned of every evaluated question. -> (rows, manifest); rows: {id, source, question, answer,
    solution, target}."""
    splits = heldout_splits(data_dir, cfg)
    candidates = load("gsm8k", "train", data_dir=data_dir) + [r for name in HELDOUT for r in splits[name][0]]
    evaluated = evaluated_sets(data_dir, cfg)
    banned = {question_key(r.question) for records in evaluated.values() for r in records}
    rows: list[dict[str, Any]] = []
    seen = set()
    dropped = {"duplicate": 0, "evaluated": 0}
    for r in candidates:
        key = question_key(r.question)
        if key in banned:
            dropped["evaluated"] += 1
            continue
        if key in seen:  # the AddSub/SingleEq overlap and SingleEq's own duplicate
            dropped["duplicate"] += 1
            continue
        seen.add(key)
        rows.append({"id": f"{r.source}/{r.id}", "source": r.source, "question": r.question,
                     "answer": r.answer, "solution": r.solution, "target": target_text(r)})
    by_source: dict[str, int] = {}
    for row in rows:
        by_source[row["source"].split("/")[0]] = by_source.get(row["source"].split("/")[0], 0) + 1
    manifest = {
        "split": cfg.to_json(), "tag": cfg.tag(),
        "train_size": len(rows), "train_by_dataset": by_source, "dropped": dropped,
        "evaluated": {name: {"size": len(records), "ids_sha256": _ids_hash(records)}
                      for name, records in evaluated.items()},
        "note": ("GSM8K train + seeded held-out parts of AddSub, SingleEq, SVAMP; evaluate with "
                 "`--split heldout` (same seed and fraction) so the evaluated items are disjoint from these. "
                 "MAWPS is excluded: it contains most of AddSub and SingleEq."),
    }
    return rows, manifest


def _ids_hash(records: list[Record]) -> str:
    return hashlib.sha256("\n".join(sorted(r.id for r in records)).encode()).hexdigest()[:16]


def write_trainset(out_dir: str | Path, data_dir: str | Path | None = None,
                   cfg: SplitSettings = DEFAULT_SPLIT) -> Path:
    """Write train.jsonl and manifest.json into `out_dir`; returns the manifest path."""
    out_dir = Path(out_dir)
    rows, manifest = build_trainset(data_dir_from(data_dir), cfg)
    write_jsonl(out_dir / "train.jsonl", rows)
    return write_json(out_dir / "manifest.json", manifest)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m keyheads.data.trainset", description=build_trainset.__doc__)
    p.add_argument("out", help="folder for train.jsonl and manifest.json")
    p.add_argument("--data-dir", help="benchmarks folder (default: $KEYHEADS_DATA)")
    p.add_argument("--seed", type=int, default=SplitSettings().seed)
    p.add_argument("--train-fraction", type=float, default=SplitSettings().train_fraction)
    args = p.parse_args(argv)
    path = write_trainset(args.out, args.data_dir, SplitSettings(seed=args.seed, train_fraction=args.train_fraction))
    manifest = json.loads(Path(path).read_text())
    configure_log()
    logger.info("%d training rows %s; manifest: %s", manifest["train_size"], manifest["train_by_dataset"], path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

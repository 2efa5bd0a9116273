"""Benchmark loaders: the paper's four math sets, MAWPS, MMLU and CommonsenseQA as `Record`s.

Data comes from a folder in the original formats (``--data-dir`` or ``$KEYHEADS_DATA``,
laid out as ``gsm8k/test.jsonl``, ``mmlu/test/*_test.csv`` and so on), or from the
Hugging Face hub through the optional `datasets` package when the machine is online.

    >>> from keyheads.data.benchmarks import load
    >>> items = load("gsm8k", "test", data_dir="path/to/benchmarks")
"""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadFile, DataNotFound, UserError
from ..log import logger

DATA_ENV = "KEYHEADS_DATA"
LETTERS = "ABCDEFGHIJ"


@dataclass(frozen=True)
class Record:
    """One benchmark item.

    Attributes:
        id: stable identifier, unique within a split (the dataset's own id where it has one).
        question: the problem text as the model should read it.
        source: "benchmark/split", for example "gsm8k/test".
        answer: the numeric answer (math sets), else None.
        choices: the answer options (multiple choice), else empty.
        label: index of the correct option in `choices` (multiple choice), else None.
        subject: the MMLU subject (for example "abstract_algebra"), else None.
        solution: the worked solution or equation where the data has one (GSM8K rationale
            with its ``<<a*b=c>>`` calculator marks removed and without the ``#### N`` line).
    """

    id: str
    question: str
    source: str
    answer: float | None = None
    choices: tuple[str, ...] = ()
    label: int | None = None
    subject: str | None = None
    solution: str | None = None

    @property
    def letter(self) -> str | None:
        return None if self.label is None else LETTERS[self.label]

    def numeric_answer(self) -> float:
        """The answer of a math item; a ValueError for an item without one."""
        if self.answer is None:
            raise ValueError(f"{self.source}/{self.id} has no numeric answer")
        return self.answer


# ---- parsing the original formats ----------------------------------------------------------

def parse_number(text: str) -> float:
    """'1,234' -> 1234.0, '$18' -> 18.0, '-3.5' -> -3.5."""
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    return float(cleaned)


def gsm8k_answer(solution: str) -> tuple[str, float]:
    """Split a GSM8K answer field into (rationale without calculator marks, final number)."""
    body, sep, final = solution.rpartition("####")
    if not sep:
        raise BadFile(f"GSM8K answer without '#### N': {solution[-80:]!r}")
    rationale = re.sub(r"<<[^>]*>>", "", body).strip()
    return rationale, parse_number(final)


def _read_json_list(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise BadFile(f"{path}: expected a JSON list of objects")
    return data


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _gsm8k(rows: list[dict], split: str) -> list[Record]:
    out = []
    for i, row in enumerate(rows):
        rationale, answer = gsm8k_answer(row["answer"])
        out.append(Record(f"{i}", row["question"].strip(), f"gsm8k/{split}", answer=answer, solution=rationale))
    return out


def _svamp(rows: list[dict], split: str) -> list[Record]:
    out = []
    for row in rows:
        # body + " " + question, as in the zero-shot-CoT evaluation code
        question = row["Body"].strip() + " " + row["Question"].strip()
        out.append(Record(str(row["ID"]), question, f"svamp/{split}", answer=float(row["Answer"]),
                          solution=row["Equation"].strip()))
    return out


def _alg514_style(name: str) -> Callable[[list[dict], str], list[Record]]:
    """AddSub and SingleEq share the format {iIndex, sQuestion, lEquations, lSolutions}."""
    def parse(rows: list[dict], split: str) -> list[Record]:
        return [Record(str(row["iIndex"]), " ".join(row["sQuestion"].split()), f"{name}/{split}",
                       answer=float(row["lSolutions"][0]), solution="; ".join(row["lEquations"]))
                for row in rows]
    return parse


def _mawps(rows: list[dict], split: str) -> list[Record]:
    return [Record(str(row["id"]), row["original_text"].strip(), f"mawps/{split}", answer=float(row["ans"]),
                   solution=row["equation"]) for row in rows]


def _csqa(rows: list[dict], split: str) -> list[Record]:
    out = []
    for row in rows:
        q = row["question"]
        choices = q["choices"]
        # local files nest choices as a list of {label, text}; the hub as {label: [...], text: [...]}
        if isinstance(choices, dict):
            labels, texts = list(choices["label"]), list(choices["text"])
        else:
            labels, texts = [c["label"] for c in choices], [c["text"] for c in choices]
        stem = q["stem"] if isinstance(q, dict) else q
        out.append(Record(str(row["id"]), stem.strip(), f"csqa/{split}", choices=tuple(texts),
                          label=labels.index(row["answerKey"])))
    return out


def _mmlu_folder(folder: Path, split: str) -> list[Record]:
    files = sorted(folder.glob(f"*_{split}.csv"))
    if not files:
        raise DataNotFound(f"{folder} has no *_{split}.csv files")
    out = []
    for path in files:
        subject = path.name[: -len(f"_{split}.csv")]
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.reader(f)
            header = next(reader)
            if header[:6] != ["question", "choice0", "choice1", "choice2", "choice3", "answer"]:
                raise BadFile(f"{path}: expected the header question,choice0..choice3,answer, got {header}")
            for i, row in enumerate(reader):
                out.append(Record(f"{subject}/{i}", row[0].strip(), f"mmlu/{split}", choices=tuple(row[1:5]),
                                  label=int(row[5]), subject=subject))
    return out


# ---- the registry ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Benchmark:
    """Where a benchmark lives and how to read it.

    Attributes:
        name: short name used on the command line.
        kind: "math" (numeric answer, generated) or "choice" (multiple choice, scored by letter logits).
        files: split -> path inside the data folder (a file, or for MMLU a folder of CSVs).
        evaluated: the split that evaluation uses by default.
        fmt: the expected file format, for error messages.
        parse: (raw rows, split) -> records; MMLU reads its folder itself.
        hub: (hub id, config) of the same data on the Hugging Face hub, or None.
        hub_splits: our split -> the hub splits to concatenate.
    """

    name: str
    kind: str
    files: dict[str, str]
    evaluated: str
    fmt: str
    parse: Callable
    hub: tuple[str, str | None] | None = None
    hub_splits: dict[str, tuple[str, ...]] | None = None


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("gsm8k", "math", {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"}, "test",
              "JSON lines {question, answer}; the answer ends with '#### N'", _gsm8k,
              ("openai/gsm8k", "main"), {"train": ("train",), "test": ("test",)}),
    Benchmark("svamp", "math", {"test": "svamp/SVAMP.json"}, "test",
              "a JSON list of {ID, Body, Question, Equation, Answer, Type}", _svamp,
              # the hub copy splits the 1000 problems 700/300; together they are the original set
              ("ChilleD/SVAMP", None), {"test": ("train", "test")}),
    Benchmark("addsub", "math", {"test": "addsub/AddSub.json"}, "test",
              "a JSON list of {iIndex, sQuestion, lEquations, lSolutions}", _alg514_style("addsub")),
    Benchmark("singleeq", "math", {"test": "singleeq/questions.json"}, "test",
              "a JSON list of {iIndex, sQuestion, lEquations, lSolutions}", _alg514_style("singleeq")),
    Benchmark("mawps", "math", {"train": "mawps/trainset.json", "valid": "mawps/validset.json",
                                "test": "mawps/testset.json"}, "test",
              "a JSON list of {id, original_text, equation, ans}", _mawps),
    Benchmark("mmlu", "choice", {"dev": "mmlu/dev", "test": "mmlu/test"}, "test",
              "a folder of <subject>_<split>.csv files with header question,choice0..choice3,answer (answer 0-3)",
              _mmlu_folder, ("cais/mmlu", "all"), {"dev": ("dev",), "test": ("test",)}),
    Benchmark("csqa", "choice", {"train": "csqa/train_rand_split.jsonl", "dev": "csqa/dev_rand_split.jsonl"}, "dev",
              "JSON lines {id, answerKey, question: {stem, choices: [{label, text}]}}", _csqa,
              ("tau/commonsense_qa", None), {"train": ("train",), "dev": ("validation",)}),
)}


def get_benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise UserError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def data_dir_from(data_dir: str | Path | None = None) -> Path | None:
    """The data folder: the argument, else $KEYHEADS_DATA, else None."""
    value = data_dir if data_dir is not None else os.getenv(DATA_ENV)
    return Path(value).expanduser() if value else None


def hub_possible() -> bool:
    """True when `datasets` is installed and the environment does not declare itself offline."""
    offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes")
                  for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return not offline and importlib.util.find_spec("datasets") is not None


def _hub_hint(bench: Benchmark) -> str:
    if bench.hub is None:
        return "it has no hub copy in its original format, so a data folder is needed"
    hub_id, config = bench.hub
    where = hub_id + (f" (config {config!r})" if config else "")
    if hub_possible():
        return f"hub id {where}"
    return f"hub id {where}, which needs `pip install datasets` and a network (HF_HUB_OFFLINE unset)"


def _missing(bench: Benchmark, split: str, path: Path | None) -> DataNotFound:
    if path is None:
        return DataNotFound(
            f"no data folder for {bench.name}/{split}: pass --data-dir or set ${DATA_ENV} to a folder holding "
            f"{bench.files[split]} ({bench.fmt}); or load it from the hub: {_hub_hint(bench)}")
    return DataNotFound(f"{path} not found: {bench.name}/{split} is expected there as {bench.fmt}; "
                        f"or load it from the hub: {_hub_hint(bench)}")


def _load_hub(bench: Benchmark, split: str) -> list[Record]:
    import datasets  # noqa: PLC0415 -- optional (not a dependency of keyheads): only the hub path needs it

    if bench.hub is None or bench.hub_splits is None:
        raise ValueError(f"{bench.name} has no hub copy")  # callers check bench.hub first
    hub_id, config = bench.hub
    rows: list[dict] = []
    for hub_split in bench.hub_splits[split]:
        try:
            rows.extend(dict(r) for r in datasets.load_dataset(hub_id, config, split=hub_split))
        except OSError as err:  # no network, or the hub refused: the same advice as a missing folder
            raise DataNotFound(f"{bench.name}/{split} is not in the data folder and could not be loaded from the "
                               f"hub ({hub_id}: {err}); pass --data-dir or set ${DATA_ENV} to a folder holding "
                               f"{bench.files[split]}") from None
    if bench.name == "mmlu":
        counters: dict[str, int] = {}
        out = []
        for r in rows:
            i = counters.get(r["subject"], 0)
            counters[r["subject"]] = i + 1
            out.append(Record(f"{r['subject']}/{i}", r["question"].strip(), f"mmlu/{split}",
                              choices=tuple(r["choices"]), label=int(r["answer"]), subject=r["subject"]))
        return out
    return bench.parse(rows, split)


def load(name: str, split: str | None = None, data_dir: str | Path | None = None,
         source: str = "auto") -> list[Record]:
    """Records of one benchmark split, in the file's order.

    Args:
        name: a key of BENCHMARKS (gsm8k, svamp, addsub, singleeq, mawps, mmlu, csqa).
        split: for example "train" or "test"; default: the evaluated split.
        data_dir: the benchmarks folder; default $KEYHEADS_DATA.
        source: "local", "hub", or "auto" (the folder when it has the file, else the hub
            when that is possible, else an error naming the path, format and hub id).
    """
    bench = get_benchmark(name)
    split = split or bench.evaluated
    if split not in bench.files:
        raise UserError(f"{name} has no split {split!r}; it has {', '.join(bench.files)}")
    if source not in ("auto", "local", "hub"):
        raise UserError(f"source must be auto, local or hub, not {source!r}")
    folder = data_dir_from(data_dir)
    path = folder / bench.files[split] if folder else None
    if source != "hub" and path is not None and path.exists():
        if bench.name == "mmlu":
            return _mmlu_folder(path, split)
        rows = _read_jsonl(path) if path.suffix == ".jsonl" else _read_json_list(path)
        return bench.parse(rows, split)
    if source == "local" or bench.hub is None or not hub_possible():
        raise _missing(bench, split, path)
    if path is not None:
        logger.warning("%s not found; loading %s/%s from the hub (%s)", path, name, split, bench.hub[0])
    return _load_hub(bench, split)


def question_key(text: str) -> str:
    """A normalised form for finding the same question across datasets.

    Ignores case, spacing, punctuation and thousands separators: SingleEq writes "64,535"
    where AddSub has "64535" for the same question.
    """
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text.lower())
    return " ".join(re.findall(r"[a-z]+|\d+(?:\.\d+)?", text))

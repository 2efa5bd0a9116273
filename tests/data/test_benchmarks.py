"""Benchmark loaders and the clean math training set, checked against the raw files."""
import csv
import json
import re

import pytest

from keyheads.data.benchmarks import BENCHMARKS, DataNotFound, load, question_key
from keyheads.data.trainset import SplitSettings, build_trainset, heldout_splits, write_trainset


@pytest.mark.parametrize("name,split,count", [
    ("gsm8k", "test", 1319), ("gsm8k", "train", 7473), ("svamp", "test", 1000), ("addsub", "test", 395),
    ("singleeq", "test", 508), ("mawps", "train", 1898), ("mawps", "valid", 237), ("mawps", "test", 238),
    ("mmlu", "test", 14042), ("mmlu", "dev", 285), ("csqa", "dev", 1221), ("csqa", "train", 9741),
])
def test_counts(shared_data, name, split, count):
    records = load(name, split, data_dir=shared_data)
    assert len(records) == count
    assert len({r.id for r in records}) == count  # ids are unique within a split
    assert all(r.source == f"{name}/{split}" and r.question for r in records)


def test_default_split_and_env_var(shared_data, monkeypatch):
    monkeypatch.setenv("KEYHEADS_DATA", str(shared_data))
    assert len(load("csqa")) == 1221 and len(load("gsm8k")) == 1319


@pytest.mark.parametrize("split", ["train", "test"])
def test_gsm8k_answers_match_the_raw_final_line(shared_data, split):
    raw = (shared_data / "gsm8k" / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
    records = load("gsm8k", split, data_dir=shared_data)
    for line, rec in zip(raw, records):
        # independent parse: the last line of the raw text, "#### 1,234"
        final = re.search(r"####\s*([-\d,.]+)\s*\"\s*}\s*$", line).group(1)
        assert rec.answer == float(final.replace(",", ""))
        assert "<<" not in rec.solution and "####" not in rec.solution


def test_svamp_answers_equal_their_equations(shared_data):
    raw = json.loads((shared_data / "svamp" / "SVAMP.json").read_text())
    by_id = {r.id: r for r in load("svamp", data_dir=shared_data)}
    agree = 0
    for row in raw:
        rec = by_id[row["ID"]]
        assert rec.answer == float(row["Answer"])
        agree += rec.answer == pytest.approx(eval(row["Equation"]))  # arithmetic only, from the data itself
        assert row["Body"].strip() in rec.question and row["Question"].strip() in rec.question
    assert agree >= 0.99 * len(raw)  # the official answers; one known row disagrees with its equation


def _solve_linear(equation: str) -> float:
    """Solve a one-unknown linear equation such as '70-x=27' or 'X = 70 - 27'."""
    left, right = equation.lower().replace(" ", "").split("=")[:2]
    f = lambda x: eval(f"({left})-({right})", {"x": x})  # noqa: E731
    return -f(0) / (f(1) - f(0))


@pytest.mark.parametrize("name,file", [("addsub", "addsub/AddSub.json"), ("singleeq", "singleeq/questions.json")])
def test_addsub_singleeq_answers(shared_data, name, file):
    raw = json.loads((shared_data / file).read_text())
    records = load(name, data_dir=shared_data)
    agree = 0
    for row, rec in zip(raw, records):
        assert rec.id == str(row["iIndex"])
        assert rec.answer == float(row["lSolutions"][0])
        try:
            agree += abs(_solve_linear(row["lEquations"][0]) - rec.answer) <= 1e-2 * max(1.0, abs(rec.answer))
        except (ZeroDivisionError, SyntaxError):
            pass
    # the answers are the datasets' lSolutions; their equations agree except for a few noisy rows
    assert agree >= 0.97 * len(records)


def test_mmlu_rows_match_the_csv_files(shared_data):
    records = load("mmlu", "test", data_dir=shared_data)
    assert len({r.subject for r in records}) == 57
    assert all(len(r.choices) == 4 and 0 <= r.label < 4 for r in records)
    by_id = {r.id: r for r in records}
    for path in sorted((shared_data / "mmlu" / "test").glob("*.csv"))[::7]:
        subject = path.name.removesuffix("_test.csv")
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))[1:]
        for i in (0, len(rows) - 1):
            rec = by_id[f"{subject}/{i}"]
            assert rec.question == rows[i][0].strip() and list(rec.choices) == rows[i][1:5]
            assert rec.letter == "ABCD"[int(rows[i][5])]


def test_csqa_labels_are_the_answer_keys(shared_data):
    raw = [json.loads(line) for line in (shared_data / "csqa" / "dev_rand_split.jsonl").read_text().splitlines()]
    records = load("csqa", "dev", data_dir=shared_data)
    for row, rec in zip(raw, records):
        assert rec.letter == row["answerKey"]
        assert rec.choices[rec.label] == next(
            c["text"] for c in row["question"]["choices"] if c["label"] == row["answerKey"]
        )


def test_missing_file_names_path_format_and_hub_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataNotFound) as err:
        load("gsm8k", "test", data_dir=tmp_path)
    message = str(err.value)
    assert str(tmp_path / "gsm8k" / "test.jsonl") in message and "#### N" in message and "openai/gsm8k" in message
    with pytest.raises(DataNotFound, match="cais/mmlu"):
        load("mmlu", data_dir=tmp_path)
    monkeypatch.delenv("KEYHEADS_DATA", raising=False)
    with pytest.raises(DataNotFound, match="--data-dir.*KEYHEADS_DATA"):
        load("addsub")
    with pytest.raises(ValueError, match="known: gsm8k, svamp"):
        load("nope")
    with pytest.raises(ValueError, match="has no split 'train'"):
        load("svamp", "train", data_dir=tmp_path)


def test_every_benchmark_says_where_it_lives():
    for bench in BENCHMARKS.values():
        assert bench.evaluated in bench.files and bench.fmt
        if bench.hub:
            assert set(bench.hub_splits) == set(bench.files)


# ---- the training set ----------------------------------------------------------------------------

def _norm(text: str) -> str:
    """A second, independent normalisation: letters and digits only."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def test_addsub_singleeq_overlap_is_found(shared_data):
    addsub, singleeq = load("addsub", data_dir=shared_data), load("singleeq", data_dir=shared_data)
    strict = {_norm(r.question) for r in addsub} & {_norm(r.question) for r in singleeq}
    keyed = {question_key(r.question) for r in addsub} & {question_key(r.question) for r in singleeq}
    words = lambda rs: {" ".join(re.findall(r"[a-z]+|\d+(?:\.\d+)?", r.question.lower())) for r in rs}  # noqa: E731
    # 111 questions are the same up to spacing; more differ only in thousands separators (64,535 / 64535)
    assert len(words(addsub) & words(singleeq)) == 111
    assert len(keyed) == len(strict) > 111


def test_trainset_is_disjoint_from_what_is_evaluated(shared_data, tmp_path):
    cfg = SplitSettings(seed=3, train_fraction=0.3)
    manifest_path = write_trainset(tmp_path, shared_data, cfg)
    train = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().split("\n") if line]
    manifest = json.loads(manifest_path.read_text())
    assert manifest["train_size"] == len(train) and manifest["split"] == {"seed": 3, "train_fraction": 0.3}

    # the evaluated items: GSM8K test and the held-out parts, recomputed from the loaders
    splits = heldout_splits(shared_data, cfg)
    evaluated = load("gsm8k", "test", data_dir=shared_data) + [r for _, held in splits.values() for r in held]
    train_text = {_norm(row["question"]) for row in train}
    assert not train_text & {_norm(r.question) for r in evaluated}
    assert len(train_text) == len(train)  # deduplicated
    for name, (tr, held) in splits.items():
        assert manifest["evaluated"][name]["size"] == len(held)
        assert not {r.id for r in tr} & {r.id for r in held}
    # every GSM8K train question is in, and some of each held-out set
    sources = {row["source"].split("/")[0] for row in train}
    assert sources == {"gsm8k", "addsub", "singleeq", "svamp"}
    assert sum(row["source"] == "gsm8k/train" for row in train) == 7473
    for row in train:
        stated = re.fullmatch(r".*The answer is (-?[\d.e+-]+)\.", row["target"], re.S).group(1)
        assert float(stated) == pytest.approx(row["answer"], rel=1e-5)


def test_held_out_split_is_seeded(shared_data):
    a = heldout_splits(shared_data, SplitSettings(seed=1))
    b = heldout_splits(shared_data, SplitSettings(seed=1))
    c = heldout_splits(shared_data, SplitSettings(seed=2))
    ids = lambda s: {n: [r.id for r in held] for n, (_, held) in s.items()}  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c)
    rows, manifest = build_trainset(shared_data, SplitSettings(seed=1, train_fraction=0.0))
    assert manifest["train_by_dataset"] == {"gsm8k": 7473}

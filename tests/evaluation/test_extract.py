"""Answer extraction on real GSM8K and SVAMP answers, numeric matching, Wilson intervals."""
import json
import math
from statistics import NormalDist

import numpy as np
import pytest

from keyheads.data.benchmarks import load
from keyheads.data.trainset import target_text
from keyheads.evaluation.extract import extract_answer, numbers_match, wilson
from keyheads.evaluation.prompts import cut_at_stop


def test_gsm8k_reference_solutions_give_the_final_number(shared_data):
    lines = (shared_data / "gsm8k" / "test.jsonl").read_text(encoding="utf-8").split("\n")
    rows = [json.loads(line) for line in lines if line.strip()]
    assert len(rows) == 1319
    for row in rows:
        independent = float(row["answer"].split("####")[-1].strip().replace(",", ""))
        value, _, how = extract_answer(row["answer"])
        assert how == "marked" and value == independent


def test_training_targets_give_their_answer(shared_data):
    # the "... The answer is N." form that few-shot exemplars and fine-tuning targets use
    for rec in load("gsm8k", "train", data_dir=shared_data)[:2000]:
        value, found, how = extract_answer(target_text(rec))
        assert how == "marked" and numbers_match(value, rec.answer, found)


def test_svamp_answers_with_equation_and_thousands(shared_data):
    raw = json.loads((shared_data / "svamp" / "SVAMP.json").read_text())
    for row in raw:
        answer = row["Answer"]
        plain, grouped = (f"{answer:.0f}", f"{answer:,.0f}") if answer == int(answer) else (repr(answer),) * 2
        # last number wins over the equation's operands, with or without thousands separators
        for text in (f"{row['Equation']} = {plain}", f"So it is {row['Equation']}. The answer is {grouped} items."):
            value, found, _ = extract_answer(text)
            assert numbers_match(value, answer, found), (text, value)


@pytest.mark.parametrize("text,want,how", [
    ("The answer is $1,234.50.", 1234.5, "marked"),
    ("#### -3", -3.0, "marked"),
    ("The answer is 5. The answer is 6.", 6.0, "marked"),
    ("I think 3, then 4.", 4.0, "last"),
    ("It costs 18.", 18.0, "last"),
    ("about .5 of them", 0.5, "last"),
    ("no digits here", None, "none"),
    ("", None, "none"),
])
def test_extract_cases(text, want, how):
    value, _, got_how = extract_answer(text)
    assert got_how == how and value == want


def test_numeric_tolerance():
    assert numbers_match(2.0, 2.0, "2") and numbers_match(0.1 + 0.2, 0.3, "0.3")
    assert numbers_match(1.83, 11 / 6, "1.83")  # rounded to the decimals it states
    assert not numbers_match(1.8, 11 / 6, "1.8")  # one decimal is too coarse
    assert not numbers_match(2.0, 11 / 6, "2") and not numbers_match(None, 3.0)
    assert not numbers_match(1.84, 11 / 6, "1.84")


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (57, 1319), (1, 1)])
def test_wilson_is_the_root_pair_of_its_quadratic(k, n):
    z, p = NormalDist().inv_cdf(0.975), k / n  # the exact 95% quantile (1.95996398...)
    # (p - q)^2 = z^2 q (1 - q) / n  <=>  (1 + z^2/n) q^2 - (2p + z^2/n) q + p^2 = 0
    roots = sorted(np.roots([1 + z * z / n, -(2 * p + z * z / n), p * p]).real)
    lo, hi = wilson(k, n)
    assert lo == pytest.approx(max(0.0, roots[0]), abs=1e-9) and hi == pytest.approx(min(1.0, roots[1]), abs=1e-9)
    assert lo <= p <= hi


def test_stop_rules():
    assert cut_at_stop(" 2+3=5. The answer is 5.\n\nQuestion: next") == len(" 2+3=5. The answer is 5.")
    assert cut_at_stop(" The answer is 5. The answer is 5. The") == len(" The answer is 5.")
    assert cut_at_stop(" The answer is 1,5") is None  # the number may go on (1,500)
    assert cut_at_stop(" The answer is 2.") is None  # 2.5 is still possible
    assert cut_at_stop(" 4 apples\nQuestion: x") == len(" 4 apples\n")
    assert math.isfinite(extract_answer(" The answer is 1,500 apples"[:cut_at_stop(" The answer is 1,500 apples")])[0])

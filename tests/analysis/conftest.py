"""Small pairs files for the tiny character-level models (every digit and character is a token)."""
import json
import random

import pytest
import torch

from keyheads.testing import tiny_model

PREFIX = "1 + 2 = 3\n"  # 10 tokens; A is the 11th


def make_rows(n: int = 24, seed: int = 0, ops=(("addition", "+", "@"), ("subtraction", "-", "#"))):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        task, op, cf_op = ops[i % len(ops)]
        a, b = rng.randint(5, 9), rng.randint(1, 4)
        c = a + b if op == "+" else a - b
        ref = f"{PREFIX}{a} {op} {b} = "
        rows.append({"task": task, "template": f"{task[:3]}-eq", "reference": ref,
                     "counterfactual": ref.replace(f" {op} ", f" {cf_op} ", 1), "answer": str(c)[0],
                     "operands": {"A": str(a), "B": str(b)},
                     "positions": {"A": len(PREFIX), "B": len(PREFIX) + 4, "operator": len(PREFIX) + 2}})
    return rows


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture
def pairs_file(tmp_path):
    return write_rows(tmp_path / "pairs.jsonl", make_rows())


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models are far faster on one thread (no thread sync per small op), most of all on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""A tiny model and a small pairs file (the benchmark folder `tiny_data` is in tests/conftest.py)."""
import json

import pytest

from keyheads.testing import tiny_model


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama", seed=1)


@pytest.fixture
def pairs_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [{"reference": f"{a}+{b}=", "counterfactual": f"{a}@{b}=", "answer": str(a + b)}
            for a, b in [(1, 2), (3, 4), (5, 1), (2, 7)]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path

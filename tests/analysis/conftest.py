"""A tiny Llama, a small pairs file for it, and one thread per test."""
import pytest
import torch

from keyheads.testing import tiny_model

from tests.helpers import make_rows, write_rows


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

import os
from pathlib import Path

import pytest
import torch

from tests.helpers import write_tiny_benchmarks

# Two threads a process; one a worker when pytest-xdist runs the tests in parallel (`make test`: two workers), so
# that the workers do not take each other's cores.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1)))

# Tests never reach the hub: a benchmark or model missing from the test data is an error, not a download.
for _offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_offline, "1")

# The shared benchmark data lives beside the checkout; tests read it there, never a copy.
SHARED_DATA = Path(os.environ.get("KEYHEADS_TEST_DATA",
                                  Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks"))


def pytest_collection_modifyitems(items):
    """The modules marked `longest` first, the rest in file order: the two workers (`--dist loadfile
    --no-loadscope-reorder`) take each module in this order as they come free, so the longest, taken last, would
    leave one worker running it alone for minutes at the end (test_witness: about a third of a worker's time)."""
    items.sort(key=lambda item: item.get_closest_marker("longest") is None)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"benchmark data not found at {SHARED_DATA}; set KEYHEADS_TEST_DATA")
    return SHARED_DATA


@pytest.fixture(scope="session")
def smollm2():
    """The bundled SmolLM2, converted once per cache folder."""
    from keyheads.models import load_model

    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A hand-made benchmark folder in the original formats, small enough for tiny random models."""
    return write_tiny_benchmarks(tmp_path_factory.mktemp("benchmarks"))

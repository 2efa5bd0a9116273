import pytest

from keyheads.finetune.data import Example


@pytest.fixture(scope="session")
def examples():
    """A small arithmetic set with varied lengths (so micro-batches pad differently)."""
    rows = []
    for i in range(24):
        a, b = 7 * i % 50, 3 * i % 20
        rows.append(Example(f"{a} + {b} = " if i % 3 else f"Q: {a} plus {b}? A: ", f"{a + b}" + "!" * (i % 4)))
    return rows

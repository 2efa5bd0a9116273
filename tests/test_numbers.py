"""How numbers are written for people."""
import pytest

from keyheads.numbers import format_number, human


@pytest.mark.parametrize(
    "value, shown", [(51.0, "51"), (2.5, "2.5"), (-3, "-3"), (1 / 3, "0.333333"), (1e20, "100000000000000000000")]
)
def test_format_number(value, shown):
    assert format_number(value) == shown


@pytest.mark.parametrize("n, shown", [(0, "0"), (999, "999"), (1000, "1K"), (1234567, "1.23M"), (2.5e9, "2.5B"),
                                      (12.7, "12"), (None, "–"), (float("nan"), "–"), (True, "–"), ("7", "–")])
def test_human(n, shown):
    assert human(n) == shown

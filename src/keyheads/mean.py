"""The knockout mean: what a knocked-out head's (or MLP's) output is replaced by. One type, one name (`mean`)
for the flag, the YAML key, the saved field and the cache key, and one default, for every stage and command
that knocks out: the curves, the transfer table and the eval table's knockout rows. No torch here, so settings
and readers import it cheaply.

    aligned  the mean at each position counted back from END over the counterfactual prompts (the curves'
             and the transfer table's); positions before those prompts' length, and generated tokens, get
             the mean over all positions
    global   one mean over all positions of the counterfactual prompts
"""
from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field

from .errors import SettingError

KnockoutMean = Literal["aligned", "global"]
MEANS: tuple[str, ...] = get_args(KnockoutMean)
DEFAULT_MEAN: KnockoutMean = "aligned"
MEAN_HELP = ("what a knocked-out head's output is replaced by: aligned (the mean at each position counted from END "
             "over the counterfactual prompts; positions before their length and generated tokens get the mean over "
             "all positions) or global (one mean over all positions)")

def mean_field() -> Any:
    """The pydantic field of a settings class that takes the mean."""
    return Field(default=DEFAULT_MEAN, description=MEAN_HELP)


def check_mean(mean: str) -> KnockoutMean:
    if mean not in MEANS:
        raise SettingError("knockout mean", mean, f"must be one of {', '.join(MEANS)}")
    return mean  # type: ignore[return-value]

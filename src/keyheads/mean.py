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

# the names the mean was saved under before it had one name, by the records that used them: knockout.json and its
# config, results.json's config; and a knockout row's info in results.json, the evaluator's first knockout rows
# (the global mean)
_FORMER_NAMES = ("mean_mode", "knockout_mean")
_FORMER_ROW_NAME = "mode"


def mean_field() -> Any:
    """The pydantic field of a settings class that takes the mean."""
    return Field(default=DEFAULT_MEAN, description=MEAN_HELP)


def check_mean(mean: str) -> KnockoutMean:
    if mean not in MEANS:
        raise SettingError("knockout mean", mean, f"must be one of {', '.join(MEANS)}")
    return mean  # type: ignore[return-value]


def run_mean(config: dict) -> str:
    """A run's one knockout mean, from its config.json: the knockout section's; a run from before the one
    mean gave its eval table's knockout row the eval section's own (the curves' default otherwise)."""
    knockout, evaluation = config.get("knockout") or {}, config.get("eval") or {}
    return str(knockout.get("mean") or evaluation.get(_FORMER_NAMES[1]) or DEFAULT_MEAN)


def upgraded(record: Any) -> Any:
    """A saved record (knockout.json, results.json, an eval config) with its mean under a former name read as
    today's: the one converter at the edge, applied where records are read (the typed results' from_json), so
    no reader knows the old names."""
    if not isinstance(record, dict):
        return record
    out = {k: upgraded(v) if k == "config" else v for k, v in record.items() if k not in _FORMER_NAMES}
    former = [record[k] for k in _FORMER_NAMES if k in record]
    if former:
        out.setdefault("mean", former[0])
    if isinstance(out.get("variants"), list):
        out["variants"] = [_upgraded_row(row) for row in out["variants"]]
    return out


def _upgraded_row(row: Any) -> Any:
    """A results.json row whose knockout info says "mode" for the mean."""
    info = row.get("info") if isinstance(row, dict) else None
    if not isinstance(info, dict):
        return row
    knockout = info.get("knockout")
    if not isinstance(knockout, dict) or _FORMER_ROW_NAME not in knockout:
        return row
    now = {k: v for k, v in knockout.items() if k != _FORMER_ROW_NAME}
    now.setdefault("mean", knockout[_FORMER_ROW_NAME])
    return {**row, "info": {**info, "knockout": now}}

"""The benchmarks by name and the settings of an evaluation run."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, field_validator

from ..data.trainset import SplitSettings
from ..errors import SettingError
from ..section import Section
from .arith import ARITH_SETS
from .mmlu_subjects import CATEGORIES as MMLU_CATEGORIES
from .mmlu_subjects import DISPLAY as MMLU_DISPLAY

MATH = ("gsm8k", "addsub", "singleeq", "svamp")
TABLE_BENCHMARKS = MATH + ("mmlu", "csqa")
MMLU_PARTS = tuple(MMLU_CATEGORIES)  # mmlu-humanities, ...: one MMLU category alone (appendix E's knockout)
CHOICE = ("mmlu", "csqa", *MMLU_PARTS)
# the accuracy of answering at random: MMLU's questions have 4 choices, CommonsenseQA's 5
CHANCE = {"mmlu": 0.25, "csqa": 0.2, **dict.fromkeys(MMLU_PARTS, 0.25)}
ARITH = tuple(ARITH_SETS)  # generated, held out from `--train arith:...`; need no data folder
DRIFT = "generic-kl"  # KL from the reference row and perplexity on MMLU/CSQA question texts, not an accuracy
BENCHMARKS = TABLE_BENCHMARKS + MMLU_PARTS + ARITH + (DRIFT,)
# how the tables (`keyheads eval`'s and the report's) name the benchmarks; an arith-* set by its own name
DISPLAY = {"gsm8k": "GSM8K", "addsub": "AddSub", "singleeq": "SingleEq", "svamp": "SVAMP",
           "mmlu": "MMLU", "csqa": "CSQA", DRIFT: "Generic", **MMLU_DISPLAY}


def display(benchmark: str) -> str:
    """A benchmark's name as the paper writes it (its own name when it has no other)."""
    return DISPLAY[benchmark] if benchmark in DISPLAY else benchmark


DEFAULT_SHOTS = {"gsm8k": 4, "addsub": 4, "singleeq": 4, "svamp": 4, "mmlu": 5, "csqa": 5,
                 **dict.fromkeys(MMLU_PARTS, 5), **dict.fromkeys(ARITH, 4)}
# GSM8K needs several reasoning steps; the other three are one or two operations. An arith answer is
# one number of at most six characters, then the newline that ends it: 8 tokens even digit by digit.
DEFAULT_NEW_TOKENS = {"gsm8k": 256, "addsub": 128, "singleeq": 128, "svamp": 128, **{name: 8 for name in ARITH}}


class EvalSettings(Section):
    """What an evaluation table's numbers depend on: the flags of `keyheads eval` (with its rows, files and
    machine) and a run's `eval:` section, passed whole to `evaluate`. Where the data is, the batch, the cache,
    progress bars and a process's share of the work are the caller's: keyword arguments of `evaluate`."""

    benchmarks: tuple[str, ...] = Field(
        default=TABLE_BENCHMARKS, description="benchmarks of the table, in its order; "
        "arith-* sets are generated, the others read data_dir")
    limit: int | None = Field(default=None, ge=1, description="only the first N items of each benchmark (MMLU: "
                                         "round-robin over subjects, so a small N still covers many; None: all)")
    max_new_tokens: int | None = Field(default=None, ge=1, description="generation budget for the math and arith sets "
                                                  "(None: 256 for GSM8K, 128 for the other math sets, 8 for arith-*)")
    few_shot: int | None = Field(default=None, ge=0, description="exemplars per prompt (None: 4 for math and arith, 5 "
                                                                    "for MMLU/CSQA; MMLU has at most 5 per subject)")
    cot: bool = Field(default=True, description="math exemplars show the GSM8K rationale before 'The answer is N.'")
    seed: int = Field(default=0, ge=0, description="picks the GSM8K-train, CSQA-train and arith exemplars")
    split: Literal["full", "heldout"] = Field(
        default="full", description="full (the whole test sets, as in the paper) or heldout (for AddSub, SingleEq "
        "and SVAMP only the part the training-set builder leaves out; the arith sets are held out either way)")
    heldout: SplitSettings = Field(default_factory=SplitSettings, description="the held-out split's seed and train "
                                                                          "fraction (must match the training set's)")

    @field_validator("benchmarks")
    @classmethod
    def _benchmarks(cls, v):
        return check_benchmarks(v)

    def shots(self, bench: str) -> int:
        k = DEFAULT_SHOTS[bench] if self.few_shot is None else self.few_shot
        return min(k, 5) if bench.startswith("mmlu") else k

    def new_tokens(self, bench: str) -> int:
        return DEFAULT_NEW_TOKENS[bench] if self.max_new_tokens is None else self.max_new_tokens


def check_shard(shard: tuple[int, int] | None, given: object = None) -> tuple[int, int] | None:
    """The one check of a shard (k, n): 0 <= k < n. `given` is how the caller spelled it, for the message."""
    if shard is not None and not (shard[1] >= 1 and 0 <= shard[0] < shard[1]):
        raise SettingError("shard", given if given is not None else f"{shard[0]}/{shard[1]}",
                           "is not valid: use K/N with 0 <= K < N, e.g. 0/2 and 1/2")
    return shard


def check_benchmarks(names: Sequence[str]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise SettingError("benchmarks", list(names),
                           f"unknown benchmark {', '.join(map(repr, unknown))}; known: {', '.join(BENCHMARKS)}")
    return tuple(names)

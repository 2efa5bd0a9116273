"""The benchmarks by name and the settings of an evaluation run."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..data.trainset import SplitConfig
from .arith import ARITH_SETS

MATH = ("gsm8k", "addsub", "singleeq", "svamp")
CHOICE = ("mmlu", "csqa")
TABLE_BENCHMARKS = MATH + CHOICE
ARITH = tuple(ARITH_SETS)  # generated, held out from `--train arith:...`; need no data folder
DRIFT = ("generic-kl",)  # KL from the reference row and perplexity on MMLU/CSQA question texts
BENCHMARKS = TABLE_BENCHMARKS + ARITH + DRIFT
DEFAULT_SHOTS = {"gsm8k": 4, "addsub": 4, "singleeq": 4, "svamp": 4, "mmlu": 5, "csqa": 5,
                 **{name: 4 for name in ARITH}}
# GSM8K needs several reasoning steps; the other three are one or two operations. An arith answer is
# one number of at most six characters, then the newline that ends it: 8 tokens even digit by digit.
DEFAULT_NEW_TOKENS = {"gsm8k": 256, "addsub": 128, "singleeq": 128, "svamp": 128, **{name: 8 for name in ARITH}}


@dataclass
class EvalConfig:
    """Settings of an evaluation run.

    Attributes:
        benchmarks: which of BENCHMARKS to run, in table order (default: TABLE_BENCHMARKS).
        data_dir: the benchmarks folder (default $KEYHEADS_DATA, else the hub when online).
        limit: evaluate only the first N items of each benchmark (MMLU: round-robin over
            subjects, so a small N still covers many subjects).
        batch_size: prompts per forward pass.
        max_new_tokens: generation budget for the math and arith sets; None = DEFAULT_NEW_TOKENS.
        few_shot: exemplars per prompt; None = DEFAULT_SHOTS (MMLU has at most 5 per subject).
        cot: math exemplars show the GSM8K rationale before "The answer is N.".
        seed: picks the GSM8K-train, CSQA-train and arith exemplars.
        split: "full" (the whole test sets, as in the paper) or "heldout" (for AddSub,
            SingleEq and SVAMP only the part the training-set builder leaves out; the arith
            sets are held out either way).
        heldout: the held-out split's seed and train fraction (must match the training set's).
        cache_dir: folder of the per-item result caches; None = $KEYHEADS_CACHE/eval, shared
            by all runs (entries are keyed by model fingerprint, prompt and settings).
        progress: show progress bars.
        shard: (k, n) to compute only the items in shard k of n (by item key), so that n
            processes or GPUs sharing one cache split an evaluation; such a run writes no
            table. A run without a shard then reads everything from the cache and writes it.
    """

    benchmarks: tuple[str, ...] = TABLE_BENCHMARKS
    data_dir: str | None = None
    limit: int | None = None
    batch_size: int = 16
    max_new_tokens: int | None = None
    few_shot: int | None = None
    cot: bool = True
    seed: int = 0
    split: str = "full"
    heldout: SplitConfig = field(default_factory=SplitConfig)
    cache_dir: str | None = None
    progress: bool = True
    shard: tuple[int, int] | None = None

    def __post_init__(self):
        if self.shard is not None:
            k, n = self.shard
            if not (n >= 1 and 0 <= k < n):
                raise ValueError(f"shard {k}/{n} is not valid: use K/N with 0 <= K < N, e.g. 0/2 and 1/2")

    def shots(self, bench: str) -> int:
        k = DEFAULT_SHOTS[bench] if self.few_shot is None else self.few_shot
        return min(k, 5) if bench == "mmlu" else k

    def new_tokens(self, bench: str) -> int:
        return DEFAULT_NEW_TOKENS[bench] if self.max_new_tokens is None else self.max_new_tokens


def check_benchmarks(names: Sequence[str]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark {', '.join(map(repr, unknown))}; known: {', '.join(BENCHMARKS)}")
    return tuple(names)

"""Evaluation (the paper's table 1): math by greedy few-shot generation, MMLU and CSQA by letter logits;
plus generated arithmetic sets (`arith-*`, held out from the arithmetic training data) that need no data.

    >>> from keyheads.evaluation import EvalSettings, Variant, evaluate
    >>> evaluate([Variant.make("model", "smollm2-135m")], EvalSettings(limit=20, data_dir="..."), "runs/eval")

The benchmark names and settings (`config`) and the tables (`table`) load without torch, so that the
report names benchmarks as the evaluation does; the names that run models load on first use (PEP 562).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names
from .extract import extract_answer, numbers_match, wilson
from .settings import ARITH, BENCHMARKS, CHOICE, DEFAULT_SHOTS, MATH, TABLE_BENCHMARKS, EvalSettings

if TYPE_CHECKING:
    from .runner import evaluate, evaluate_prepared
    from .variants import VARIANT_KINDS, Prepared, Variant, prepare, register_kind

__all__ = ["extract_answer", "numbers_match", "wilson", "evaluate", "evaluate_prepared", "ARITH", "BENCHMARKS",
           "CHOICE", "DEFAULT_SHOTS",
           "MATH", "TABLE_BENCHMARKS", "EvalSettings", "VARIANT_KINDS", "Prepared", "Variant", "prepare",
           "register_kind"]
_LAZY = {"evaluate": ".runner", "evaluate_prepared": ".runner", "VARIANT_KINDS": ".variants",
         "Prepared": ".variants", "Variant": ".variants", "prepare": ".variants", "register_kind": ".variants"}

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals(), __all__)

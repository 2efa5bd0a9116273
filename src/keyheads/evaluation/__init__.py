"""Evaluation (the paper's table 1): math by greedy few-shot generation, MMLU and CSQA by letter logits;
plus generated arithmetic sets (`arith-*`, held out from the arithmetic training data) that need no data.

    >>> from keyheads.evaluation import EvalSettings, Variant, evaluate
    >>> evaluate([Variant.make("model", "smollm2-135m")], EvalSettings(limit=20, data_dir="..."), "runs/eval")
"""
from .config import ARITH, BENCHMARKS, CHOICE, DEFAULT_SHOTS, MATH, TABLE_BENCHMARKS, EvalSettings
from .extract import extract_answer, numbers_match, wilson
from .runner import evaluate, evaluate_prepared
from .variants import VARIANT_KINDS, Prepared, Variant, prepare, register_kind

__all__ = ["extract_answer", "numbers_match", "wilson", "evaluate", "evaluate_prepared", "ARITH", "BENCHMARKS",
           "CHOICE", "DEFAULT_SHOTS",
           "MATH", "TABLE_BENCHMARKS", "EvalSettings", "VARIANT_KINDS", "Prepared", "Variant", "prepare",
           "register_kind"]

"""`make demo`: the whole study on the bundled default model, small enough for a laptop CPU.

The sizes are chosen for time: 49 single-token addition pairs behind one shared few-shot
prefix per template, 8 key heads, knockout curves to k = 12 with five random orders, a short
precise SFT of the key heads on multi-digit arithmetic, and an evaluation on the built-in
held-out arithmetic sets (plus the benchmark sets when $KEYHEADS_DATA points at them).
"""
from __future__ import annotations

from .config.run import RunSettings, merge_settings
from .data.benchmarks import data_dir_from
from .evaluation.arith import ARITH_FIRST
from .evaluation.settings import TABLE_BENCHMARKS
from .log import logger

DEMO = dict(
    out="runs/demo", batch_size=16, variants=["precise"],
    data=dict(task="addition", templates=["add-eq-1", "add-eq-2", "add-stmt-1", "add-qa-2"], n=96, few_shot=3,
              shared_prefix=True, single_token_answer=True, keep_correct=True),
    identify=dict(top_k=8),
    knockout=dict(k=12, seeds=5, limit=None, transfer_n=50),
    attention=dict(limit=None),
    mlp=dict(limit=None),
    finetune=dict(train="arith:multidigit:512", max_steps=16, lr=1e-4, optimizer_batch_size=16, micro_batch_size=8),
    eval=dict(limit=40),
)


def demo_config(overrides: dict) -> RunSettings:
    """The demo's settings, with any flag the user gave on top (`overrides` nested as the YAML)."""
    from .distributed import is_main  # noqa: PLC0415 -- torch, which `keyheads demo --help` does not need

    folder = data_dir_from(overrides.get("data_dir") or None)
    data_dir = str(folder) if folder else None
    if not data_dir and is_main():  # under a launcher, said once
        logger.warning("note: KEYHEADS_DATA is not set, so the evaluation uses only the built-in arithmetic sets "
                       "and the SVAMP/GSM8K transfer is skipped (point it at a folder with gsm8k/, svamp/, addsub/, "
                       "singleeq/, mmlu/, csqa/)")
    benchmarks = list(ARITH_FIRST) + (list(TABLE_BENCHMARKS) if data_dir else [])
    given = merge_settings(DEMO, {"eval": {"benchmarks": benchmarks}, "data_dir": data_dir})
    return RunSettings.make(**merge_settings(given, overrides))

"""`make demo`: the whole study on the bundled default model, small enough for a laptop CPU."""
from __future__ import annotations

import os

from .pipeline import PipelineConfig, run_pipeline


def demo_config(args) -> PipelineConfig:
    data_dir = os.environ.get("KEYHEADS_DATA")
    if not data_dir:
        print("note: KEYHEADS_DATA is not set, so the benchmark evaluation and the SVAMP/GSM8K transfer are "
              "skipped (point it at a folder with gsm8k/, svamp/, addsub/, singleeq/, mmlu/, csqa/)")
    return PipelineConfig(
        model=args.model, out=args.out, device=args.device, dtype=args.dtype,
        task="addition", templates=["add-eq-1", "add-eq-2", "add-stmt-1", "add-qa-2"], n=96, few_shot=3, shared_prefix=True,
        top_k=8, knockout_k=12, seeds=5, analysis_samples=None,
        eval_benchmarks=["gsm8k", "addsub", "singleeq", "svamp", "mmlu", "csqa"] if data_dir else [],
        eval_limit=args.eval_limit, data_dir=data_dir, batch_size=16,
    )


def run_demo(args) -> int:
    run_pipeline(demo_config(args))
    return 0

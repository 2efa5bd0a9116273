"""What bench/paper_gpu.py's runs and bench/paper_gpu_records.py's reading of their records share: the config they
run, the model's shape, the items a phase evaluates, and where the benchmark data is."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "paper-llama2-7b.yaml"
SHAPES = {  # LlamaConfig fields; vocab_size is the tokenizer's
    "llama-2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32),
    "tiny": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=16,
                 num_key_value_heads=16),  # the same script on a CPU, to check it before GPU time is spent
}
# The items a benchmark phases C1, C2 and C2-eval evaluate (one batch of 32), so that the eval stage's time per
# batch extrapolates to the full sets (bench/paper_gpu.py's PHASES).
EVAL_ITEMS = 32


def default_data_dir() -> Path:
    """$KEYHEADS_DATA, else the shared benchmark folder beside the checkout."""
    env = os.environ.get("KEYHEADS_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data" / "benchmarks"

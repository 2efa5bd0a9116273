"""Qwen2 and Qwen2.5: the Llama layout with biases on Q/K/V.

The Q/K/V biases are per-head rows like the weights (fine-tuning a head trains its entries), and
O has no bias, so the per-head W_O slices sum exactly to the attention output. The small models
tie the unembedding to the embedding; `get_output_embeddings()` returns the shared matrix.
"""
from dataclasses import replace

import transformers

from .llama import FAMILY as LLAMA
from .llama import TINY_LLAMA

FAMILY = replace(LLAMA, name="qwen2", model_types=("qwen2",))
TINY = {"qwen2": lambda **common: transformers.Qwen2Config(**TINY_LLAMA, **common)}

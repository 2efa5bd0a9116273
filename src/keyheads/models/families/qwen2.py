"""Qwen2 and Qwen2.5: the Llama layout with biases on Q/K/V."""
from dataclasses import replace

import transformers

from .llama import FAMILY as LLAMA
from .llama import TINY_LLAMA

FAMILY = replace(LLAMA, name="qwen2", model_types=("qwen2",))
TINY = {"qwen2": lambda **common: transformers.Qwen2Config(**TINY_LLAMA, **common)}

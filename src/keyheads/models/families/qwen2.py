"""Qwen2 and Qwen2.5: the Llama layout with biases on Q/K/V."""
from dataclasses import replace

from .llama import FAMILY as LLAMA

FAMILY = replace(LLAMA, name="qwen2", model_types=("qwen2",))

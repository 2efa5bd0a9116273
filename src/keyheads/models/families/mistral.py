"""Mistral: the Llama layout with sliding-window attention."""
from dataclasses import replace

import transformers

from .llama import FAMILY as LLAMA
from .llama import TINY_LLAMA

FAMILY = replace(LLAMA, name="mistral", model_types=("mistral",))
TINY = {"mistral": lambda **common: transformers.MistralConfig(sliding_window=None, **TINY_LLAMA, **common)}

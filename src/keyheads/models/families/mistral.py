"""Mistral: the Llama layout with sliding-window attention."""
from dataclasses import replace

from .llama import FAMILY as LLAMA

FAMILY = replace(LLAMA, name="mistral", model_types=("mistral",))

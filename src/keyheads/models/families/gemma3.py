"""Gemma 3 (text): the Llama layout with norms both before and after attention and MLP."""
from dataclasses import replace

import transformers

from .llama import FAMILY as LLAMA
from .llama import TINY_LLAMA

FAMILY = replace(
    LLAMA,
    name="gemma3",
    model_types=("gemma3_text", "gemma3"),
    post_attn_norm="post_attention_layernorm",  # normalises the attention output (in Llama: the pre-MLP norm)
    pre_mlp_norm="pre_feedforward_layernorm",
    post_mlp_norm="post_feedforward_layernorm",
)

# Sliding and full attention alternate, with a window short enough for the tests' prompts to cross it.
TINY = {"gemma3": lambda **common: transformers.Gemma3TextConfig(
    query_pre_attn_scalar=16, sliding_window=8,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"], **TINY_LLAMA, **common)}

"""Gemma 3 (text): the Llama layout with norms both before and after attention and MLP."""
from dataclasses import replace

from .llama import FAMILY as LLAMA

FAMILY = replace(
    LLAMA,
    name="gemma3",
    model_types=("gemma3_text", "gemma3"),
    post_attn_norm="post_attention_layernorm",  # normalises the attention output (in Llama: the pre-MLP norm)
    pre_mlp_norm="pre_feedforward_layernorm",
    post_mlp_norm="post_feedforward_layernorm",
)

"""Gemma 3 (text): norms both before and after attention and MLP."""
import transformers

from .base import Family
from .llama import TINY_LLAMA

FAMILY = Family(
    name="gemma3",
    model_types=("gemma3_text", "gemma3"),
    layers="model.layers",
    final_norm="model.norm",
    attn="self_attn",
    attn_out_proj="self_attn.o_proj",
    q_proj="self_attn.q_proj",
    k_proj="self_attn.k_proj",
    v_proj="self_attn.v_proj",
    post_attn_norm="post_attention_layernorm",  # normalises the attention output
    pre_mlp_norm="pre_feedforward_layernorm",
    mlp="mlp",
    post_mlp_norm="post_feedforward_layernorm",
)

# Sliding and full attention alternate, with a window short enough for the tests' prompts to cross it.
TINY = {"gemma3": lambda **common: transformers.Gemma3TextConfig(
    query_pre_attn_scalar=16, sliding_window=8,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"], **TINY_LLAMA, **common)}

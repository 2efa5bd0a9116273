"""Gemma 3 (text): norms both before and after attention and MLP."""
from .base import Family

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

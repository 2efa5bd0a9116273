"""Llama 2/3, SmolLM2, TinyLlama and other Llama-architecture models."""
from .base import Family

FAMILY = Family(
    name="llama",
    model_types=("llama",),
    layers="model.layers",
    final_norm="model.norm",
    attn="self_attn",
    attn_out_proj="self_attn.o_proj",
    q_proj="self_attn.q_proj",
    k_proj="self_attn.k_proj",
    v_proj="self_attn.v_proj",
    pre_mlp_norm="post_attention_layernorm",  # despite its name, Llama's pre-MLP norm
    mlp="mlp",
)

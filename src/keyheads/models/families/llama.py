"""Llama 2/3, SmolLM2, TinyLlama and other Llama-architecture models."""
import transformers

from .base import TINY_SIZES, Family

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

# keyheads.testing's tiny Llama uses grouped-query attention (two query heads per key/value head).
TINY_LLAMA = dict(TINY_SIZES, num_key_value_heads=2, head_dim=16)
TINY = {"llama": lambda **common: transformers.LlamaConfig(**TINY_LLAMA, **common)}

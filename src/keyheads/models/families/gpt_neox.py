"""GPT-NeoX and Pythia: fused, per-head interleaved QKV and (usually) a parallel residual."""
from .base import Family

FAMILY = Family(
    name="gpt_neox",
    model_types=("gpt_neox",),
    layers="gpt_neox.layers",
    final_norm="gpt_neox.final_layer_norm",
    attn="attention",
    attn_out_proj="attention.dense",
    qkv_proj="attention.query_key_value",
    qkv_layout="interleaved",
    pre_mlp_norm="post_attention_layernorm",
    mlp="mlp",
    parallel_residual=lambda config: bool(getattr(config, "use_parallel_residual", True)),
)

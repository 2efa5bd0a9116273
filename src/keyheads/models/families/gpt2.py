"""GPT-2: Conv1D projections and a fused c_attn (q|k|v)."""
from .base import Family

FAMILY = Family(
    name="gpt2",
    model_types=("gpt2",),
    layers="transformer.h",
    final_norm="transformer.ln_f",
    attn="attn",
    attn_out_proj="attn.c_proj",
    qkv_proj="attn.c_attn",
    qkv_layout="concat",
    pre_mlp_norm="ln_2",
    mlp="mlp",
    conv1d=True,
)

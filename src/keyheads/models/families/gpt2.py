"""GPT-2: Conv1D projections and a fused c_attn (q|k|v)."""
import transformers

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

TINY = {"gpt2": lambda **common: transformers.GPT2Config(
    n_embd=64, n_layer=3, n_head=4, n_positions=256, initializer_range=0.2, resid_pdrop=0.0, embd_pdrop=0.0,
    attn_pdrop=0.0, **common)}

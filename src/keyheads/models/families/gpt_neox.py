"""GPT-NeoX and Pythia: fused, per-head interleaved QKV and (usually) a parallel residual."""
import transformers

from .base import TINY_SIZES, Family

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


def _tiny(parallel_residual: bool):
    return lambda **common: transformers.GPTNeoXConfig(
        rotary_pct=0.5, use_parallel_residual=parallel_residual, attention_dropout=0.0, hidden_dropout=0.0,
        **TINY_SIZES, **common)


# Pythia's parallel residual and the serial one of other GPT-NeoX models take different code paths.
TINY = {"gpt_neox": _tiny(True), "gpt_neox_serial": _tiny(False)}

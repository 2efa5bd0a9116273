"""Bytes per parameter and per token, every constant in one place with where it comes from.

`b` is the bytes of an element of the compute dtype (2 for bfloat16, keyheads' default on a GPU).
The per-token counts are those of a Llama-style decoder layer (RMSNorm, SDPA attention, gated MLP:
Llama, Mistral, Qwen2); other families are estimated with the same counts. Each "saved" count was
read off the tensors autograd keeps (torch.autograd.graph.saved_tensors_hooks) in a forward pass
of transformers' LlamaDecoderLayer; tests/test_plan.py measures them again on a tiny model.
"""
from __future__ import annotations

from .shape import ModelShape

GiB = 2**30
FP32, INT64, BOOL = 4, 8, 1
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# ---- bytes per parameter ------------------------------------------------------------------------------
TRAINED_WEIGHT = FP32   # trained tensors: fp32 master weights under bf16 compute (issue 21; layer.delta_dtype)
TRAINED_GRAD = FP32     # a gradient has its parameter's dtype
ADAMW_STATE = 2 * FP32  # torch.optim.AdamW: exp_avg and exp_avg_sq, each in the parameter's dtype
# torch.optim.AdamW's step on a GPU (foreach, its default there) computes sqrt(exp_avg_sq) for a whole parameter
# group at once: one fp32 copy of the trained weights for the length of the step. Measured on a random LLaMA-2-7B
# shape under FSDP2 on one H200: full SFT peaked at 128.2 GiB allocated, 17.1 GiB above the plan without it
# (bench/RESULTS.md, "The paper config end to end on one GPU"). Activations are freed by then.
ADAMW_STEP = FP32
DELTA_BASE = FP32       # precise SFT: a delta's fp32 copy of W0's trained entries (buffer `base`, finetune/layer.py)
DDP_BUCKETS = FP32      # DDP over >1 process: a flat copy of the gradients in its buckets (gradient_as_bucket_view
#                         is off in finetune.train.make_accelerator)
# The compute-dtype copy of a trained fp32 weight, kept for the backward pass: `delta.weight.to(x.dtype)` (layer.py),
# autocast's cast of a whole weight, or FSDP2's MixedPrecisionPolicy(param_dtype=bf16) all-gather: b bytes.

# ---- FSDP2 ---------------------------------------------------------------------------------------------
FSDP_GATHERED_LAYERS = 2  # fully_shard per decoder layer: the layer computing and the one prefetched are unsharded
FSDP_GRAD_LAYERS = 1      # a layer's unsharded fp32 gradient lives until its reduce-scatter
# The root unit (embedding, unembedding, final norm) is gathered for the whole step: fully_shard does not
# reshard the root module after forward.

# ---- the GPU's own overheads ----------------------------------------------------------------------------
CUDA_CONTEXT = GiB // 2   # CUDA context and cuBLAS workspaces, outside torch's allocator (~0.5 GiB on an H100)
ALLOCATOR_SLACK = 0.10    # the caching allocator's fragmentation: plan to fill at most 90% of the rest

# ---- bytes per token kept for the backward pass (saved tensors), per decoder layer -----------------------
NORMS_PER_LAYER = 2       # input_layernorm and post_attention_layernorm
NORM_SAVED_FP32 = 1       # d_model elements in fp32: RMSNorm's input cast to fp32, kept by pow and mul
NORM_SAVED_RSTD = 1       # one fp32 rsqrt(variance) per token
NORM_TRAINED = 2          # d_model (b) per norm when everything trains: the normed input (for the norm's weight)
#                           and the output (for the next projections' weights)
NORM_OUT = 1              # d_model (b): a norm's output, kept when a projection reading it trains (delta, MLP)
SDPA_SAVED = 4            # n_heads * head_dim elements (b): q, k, v and the output; K/V at n_heads, since
#                           transformers repeats grouped K/V heads before SDPA when there is a padding mask
SDPA_LSE = 1              # SDPA's fp32 logsumexp, one per head
SDPA_MASK = 1             # seq_len elements (b): the padding mask SDPA keeps as a float mask, once per layer
MLP_SAVED_FROZEN = 3      # d_ff elements (b): gate output (kept by SiLU), SiLU output and up output (kept by *)
MLP_SAVED_TRAINED = 1     # d_ff (b): down_proj's input, kept for its weight gradient
DELTA_SLICE = 1           # per trained row or column (b): a RowDelta's output, a ColDelta's selected input
LORA_INPUTS = 4           # LoRA (PEFT upcasts to its fp32 adapters): the fp32 input of q, k, v (d_model each)
#                           and o (n_heads * head_dim), one copy per module
LORA_A_OUT = 4            # LoRA: lora_B keeps lora_A's r fp32 outputs, in each of q, k, v, o

# ---- bytes per token kept outside the layers -------------------------------------------------------------
ROPE_SAVED = 2            # cos and sin, head_dim elements each (b) per position, kept by RoPE's products
LOSS_SAVED = FP32         # per vocabulary entry: cross_entropy keeps its fp32 log-softmax of a completion row
LOSS_INDEX = INT64 + BOOL  # the target id and the label mask of a token
EMBED_IDS = INT64         # the input ids, kept when the embedding trains
# Transient, not saved: the logits in the compute dtype for every position, the fp32 copy of a completion
# row, and in the backward pass the logits' gradient (full shape, b) -- upper bound: every token a completion.
LOGITS_TRANSIENT_B = 2    # vocabulary rows in b: the logits and their gradient
LOGITS_TRANSIENT_FP32 = 1  # vocabulary rows in fp32: the completion row cast for the softmax
LAYER_GRADS = 2           # backward: gradients of one layer's activations, two of each width (d_model, d_ff) at once

# ---- inference, per token (analyses, generation) --------------------------------------------------------
# One layer's temporaries at once: residual, normed input, fp32 norm copy, q/k/v/output, gate/up/act.
INFER_LAYER_B = (2, 4, 3)  # (d_model, n_heads * head_dim, d_ff) elements in b
INFER_LOGITS = (1, 1)      # (b, fp32) vocabulary rows: logits and the metrics' fp32 copy
KV_CACHE = 2               # keys and values: n_kv_heads * head_dim elements each (b), per layer
EAGER_SCORES = (FP32, 1)   # eager attention's scores per head and key position: fp32 softmax and its b cast


def saved_layer(shape: ModelShape, b: int, seq_len: int, *, trains_all: bool = False, delta: bool = False,
                lora_rank: int = 0, mlp: bool = False) -> int:
    """Bytes per token one decoder layer keeps for the backward pass (the residual stream needs a gradient).
    `delta`: Q/K/V deltas read this layer's first norm (their slices are `saved_slices`)."""
    h, i, attn = shape.d_model, shape.d_ff, shape.n_heads * shape.head_dim
    n = NORMS_PER_LAYER * FP32 * (NORM_SAVED_FP32 * h + NORM_SAVED_RSTD)
    n += SDPA_SAVED * b * attn + SDPA_LSE * FP32 * shape.n_heads + SDPA_MASK * b * seq_len + MLP_SAVED_FROZEN * b * i
    if trains_all:
        return n + NORMS_PER_LAYER * NORM_TRAINED * b * h + MLP_SAVED_TRAINED * b * i
    if delta:
        n += NORM_OUT * b * h
    if lora_rank:
        n += FP32 * (LORA_INPUTS - 1) * h + FP32 * attn + LORA_A_OUT * FP32 * lora_rank
    if mlp:  # gate/up keep the second norm's output, down_proj its input
        n += NORM_OUT * b * h + MLP_SAVED_TRAINED * b * i
    return n


def saved_slices(shape: ModelShape, b: int, heads: int) -> int:
    """Bytes per token the deltas of `heads` heads keep: their Q and O slices and their groups' K and V."""
    groups = min(heads, shape.n_kv_groups)
    return DELTA_SLICE * b * shape.head_dim * (2 * heads + 2 * groups)


def saved_train(shape: ModelShape, b: int, seq_len: int, micro_batch: int, method: str, heads: int = 0,
                mlps: int = 0, lora_rank: int = 0) -> int:
    """Bytes per token kept for the backward pass by `method` (full, precise, lora).

    Upper bound for precise SFT: a trained head in layer 0, so that every layer keeps its tensors, and the
    first `heads` layers read by Q/K/V deltas. With a frozen embedding, layer 0's first norm keeps nothing."""
    L = shape.n_layers
    if method == "full":
        return L * saved_layer(shape, b, seq_len, trains_all=True) + saved_outside(shape, b, micro_batch, True)
    first_norm = FP32 * (NORM_SAVED_FP32 * shape.d_model + NORM_SAVED_RSTD)
    n = saved_outside(shape, b, micro_batch) - first_norm
    if method == "lora":
        return n + L * saved_layer(shape, b, seq_len, lora_rank=lora_rank)
    with_delta = min(heads, L)
    n += with_delta * saved_layer(shape, b, seq_len, delta=True) + (L - with_delta) * saved_layer(shape, b, seq_len)
    mlp_extra = saved_layer(shape, b, seq_len, mlp=True) - saved_layer(shape, b, seq_len)
    return n + saved_slices(shape, b, heads) + min(mlps, L) * mlp_extra


def saved_outside(shape: ModelShape, b: int, micro_batch: int, trains_all: bool = False) -> int:
    """Bytes per token kept outside the layers: RoPE (per position), the final norm, the loss (every token
    a completion)."""
    h = shape.d_model
    n = ROPE_SAVED * b * shape.head_dim // micro_batch + FP32 * (NORM_SAVED_FP32 * h + NORM_SAVED_RSTD)
    n += LOSS_SAVED * shape.vocab + LOSS_INDEX
    if trains_all:
        n += NORM_TRAINED * b * h + EMBED_IDS
    return n


def transient_train(shape: ModelShape, b: int) -> int:
    """Bytes per token live besides the saved tensors at the worst moment (the loss, or a layer's backward)."""
    logits = (LOGITS_TRANSIENT_B * b + LOGITS_TRANSIENT_FP32 * FP32) * shape.vocab
    return max(logits, LAYER_GRADS * b * (shape.d_model + shape.d_ff))


def infer_token(shape: ModelShape, b: int) -> int:
    """Bytes per token of a forward pass without gradients: one layer's temporaries and the logits."""
    dh, da, di = INFER_LAYER_B
    layer = FP32 * shape.d_model + b * (dh * shape.d_model + da * shape.n_heads * shape.head_dim + di * shape.d_ff)
    return layer + (INFER_LOGITS[0] * b + INFER_LOGITS[1] * FP32) * shape.vocab


def kv_cache_token(shape: ModelShape, b: int) -> int:
    return KV_CACHE * shape.n_layers * shape.n_kv_heads * shape.head_dim * b


def eager_scores_token(shape: ModelShape, b: int, seq_len: int) -> int:
    """Eager attention (read when attention patterns are): one layer's scores per token."""
    return shape.n_heads * seq_len * (EAGER_SCORES[0] + EAGER_SCORES[1] * b)


def usable(gpu_bytes: int) -> int:
    """What torch may allocate on a GPU of `gpu_bytes`."""
    return int((gpu_bytes - CUDA_CONTEXT) * (1 - ALLOCATOR_SLACK))



"""The floors the benchmarks hold their times against: the FLOPs a step must do, and the matrix-multiply rate
that turns them into seconds (bench/patching.py, bench/patching_scale.py, bench/analysis.py and its GPU part)."""
from __future__ import annotations

import time

import torch


def patching_flops(model, samples) -> tuple[float, float]:
    """(FLOPs of path patching's two capturing passes, FLOPs of the MLP work above every sender).

    Real tokens only: the padding of mixed-length batches is overhead, not work. Neither
    pass needs whole-vocabulary logits (the metric reads the answer's row of W_U), so they
    are not counted; a few dot products per row for the answers are left out as negligible.
    """
    cfg = model.config
    d, d_ff, L, H = model.d_model, cfg.intermediate_size, model.n_layers, model.n_heads
    q, kv = H * model.head_dim, model.n_kv_heads * model.head_dim
    mlp = 2 * 3 * d * d_ff                       # gated MLP: gate, up, down
    attn_proj = 2 * d * (q + 2 * kv) + 2 * q * d
    passes = 0.0
    for s in samples:
        T = len(s.ref_ids)
        attn_scores = 2 * 2 * T * q              # QK^T and AV for one query over T keys (mean T/2, x2 for both)
        per_pass = L * T * (attn_proj + mlp + attn_scores / 2)
        passes += 2 * per_pass
    rows_above = H * sum(L - l for l in range(L)) + sum(L - 1 - l for l in range(L))
    sweep = len(samples) * rows_above * mlp
    return passes, sweep


def knockout_flops(model, work) -> float:
    """FLOPs of the token-layers, attention pairs and END unembeddings the knockout curves' passes computed."""
    cfg = model.config
    d, q, kv = model.d_model, model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    per_token_layer = 2 * d * (q + 2 * kv) + 2 * q * d + 2 * 3 * d * cfg.intermediate_size
    return work.token_layers * per_token_layer + work.attention_pairs * 4 * q + work.end_rows * 2 * d * cfg.vocab_size


def matmul_rate(d: int, d_ff: int, rows: int = 4096, repeats: int = 10) -> float:
    """Best-of-`repeats` FLOP/s of a [rows, d] x [d, d_ff] matrix product on the CPU (the floor's unit of work)."""
    a, w = torch.randn(rows, d), torch.randn(d, d_ff)
    for _ in range(3):
        a @ w
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ w
        best = min(best, time.perf_counter() - t)
    return 2 * rows * d * d_ff / best


def gpu_matmul_rate(d: int, d_ff: int, dtype, rows: int = 16384, repeats: int = 20) -> float:
    """Best-of-`repeats` FLOP/s of a [rows, d] x [d, d_ff] product on the GPU (CUDA events)."""
    a = torch.randn(rows, d, device="cuda", dtype=dtype)
    w = torch.randn(d, d_ff, device="cuda", dtype=dtype)
    for _ in range(5):
        a @ w
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ w
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * rows * d * d_ff / best

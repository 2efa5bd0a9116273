"""Naive vs fast path patching on the bundled SmolLM2, side by side in one process.

Prints both times, their ratio, the largest absolute difference, and the fast sweep's
achieved FLOP rate against the FLOPs it must do (its floor at this machine's measured
matrix-multiply rate). Writes the figures into bench/RESULTS.md.

    python bench/patching.py [--n 24] [--batch-size 8] [--data pairs.jsonl]
"""
from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import write_section  # noqa: E402

from keyheads.models import load_model  # noqa: E402
from keyheads.patching.naive import naive_path_patch_batch  # noqa: E402
from keyheads.patching.path import path_patch_batch  # noqa: E402
from keyheads.patching.samples import batches, load_samples  # noqa: E402


def matmul_rate(d: int, d_ff: int, rows: int = 4096, repeats: int = 10) -> float:
    """Best-of-`repeats` FLOP/s of the GEMM shape that dominates the fast sweep."""
    a, w = torch.randn(rows, d), torch.randn(d, d_ff)
    for _ in range(3):
        a @ w
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ w
        best = min(best, time.perf_counter() - t)
    return 2 * rows * d * d_ff / best


def flop_floor(model, samples) -> tuple[float, float]:
    """(FLOPs of the two capturing passes, FLOPs of the MLP work above every sender)."""
    cfg = model.config
    d, d_ff, L, H = model.d_model, cfg.intermediate_size, model.n_layers, model.n_heads
    q, kv = H * model.head_dim, model.n_kv_heads * model.head_dim
    mlp = 2 * 3 * d * d_ff                       # gated MLP: gate, up, down
    attn_proj = 2 * d * (q + 2 * kv) + 2 * q * d
    passes = 0.0
    for s in samples:
        T = len(s.ref_ids)
        attn_scores = 2 * 2 * T * q              # QK^T and AV for one query over T keys (mean T/2, x2 for both)
        per_pass = L * T * (attn_proj + mlp + attn_scores / 2) + 2 * d * cfg.vocab_size
        passes += 2 * per_pass
    rows_above = H * sum(L - l for l in range(L)) + sum(L - 1 - l for l in range(L))
    sweep = len(samples) * rows_above * mlp
    return passes, sweep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=24, help="addition pairs (three-example prefix)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--data", help="a pairs JSONL instead of generating addition pairs")
    ap.add_argument("--no-write", action="store_true", help="print only, do not update RESULTS.md")
    args = ap.parse_args()

    model = load_model("smollm2-135m", device="cpu", dtype="float32")
    data = args.data
    if data is None:
        from keyheads.cli import main as cli

        data = str(Path(tempfile.mkdtemp()) / "addition.jsonl")
        # equation-form addition (add-eq-*), a three-example prefix, only pairs the model gets right
        code = cli(["data", "--task", "addition", "--n", str(3 * args.n), "--few-shot", "3", "--keep-correct",
                    "--template", "add-eq-1", "--template", "add-stmt-1", "--template", "add-qa-1",
                    "--single-token-answer", "--seed", "0", "--out", data])
        if code:
            raise SystemExit("could not make the benchmark data")
    samples = load_samples(model, data, limit=args.n)
    if len(samples) < 24:
        raise SystemExit(f"only {len(samples)} pairs; the benchmark needs at least 24")
    work = list(batches(samples, args.batch_size, model.device))
    lengths = sorted({len(s.ref_ids) for s in samples})

    with torch.no_grad():
        path_patch_batch(model, work[0], "relative-logit")  # warm-up, not timed
        t = time.perf_counter()
        fast = [path_patch_batch(model, b, "relative-logit") for b in work]
        t_fast = time.perf_counter() - t
        t = time.perf_counter()
        naive = [naive_path_patch_batch(model, b, "relative-logit") for b in work]
        t_naive = time.perf_counter() - t
        t = time.perf_counter()
        fast = [path_patch_batch(model, b, "relative-logit") for b in work]  # again, after the naive loop
        t_fast = min(t_fast, time.perf_counter() - t)
    diff = max(max((f.heads - n.heads).abs().max().item(), (f.mlps - n.mlps).abs().max().item())
               for f, n in zip(fast, naive))
    rate = matmul_rate(model.d_model, model.config.intermediate_size)
    passes, sweep = flop_floor(model, samples)
    floor = (passes + sweep) / rate
    ratio = t_naive / t_fast
    lines = [
        f"- date: {datetime.date.today().isoformat()}; command: `python bench/patching.py --n {args.n} "
        f"--batch-size {args.batch_size}`",
        f"- model: smollm2-135m (fp32, CPU, {torch.get_num_threads()} threads, {platform.machine()}); "
        f"{len(samples)} addition pairs with a three-example prefix, prompt lengths {lengths} tokens",
        f"- naive loop (one forward per sender, {model.n_layers * (model.n_heads + 1)} senders): {t_naive:.2f} s",
        f"- fast sweep: {t_fast:.3f} s",
        f"- **speed-up: {ratio:.1f}x** (target >= 50x); largest |fast - naive|: **{diff:.2e}** (target <= 1e-4)",
        f"- FLOPs the fast sweep must do: {passes / 1e9:.1f} GFLOP in the two capturing passes + "
        f"{sweep / 1e9:.1f} GFLOP of MLP work above the senders = {(passes + sweep) / 1e9:.1f} GFLOP",
        f"- measured matmul rate: {rate / 1e9:.1f} GFLOP/s; floor {floor:.3f} s; achieved "
        f"{(passes + sweep) / t_fast / 1e9:.1f} GFLOP/s; **fast / floor = {t_fast / floor:.2f}** (target <= 2)",
    ]
    print("\n".join(lines))
    ok = ratio >= 50 and diff <= 1e-4 and t_fast / floor <= 2
    print("targets met" if ok else "TARGETS NOT MET")
    if not args.no_write:
        write_section("Path patching: naive loop vs fast sweep (bench/patching.py)", "\n".join(lines))


if __name__ == "__main__":
    main()

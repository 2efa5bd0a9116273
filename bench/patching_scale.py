"""Path patching's fast sweep at 7B scale on one GPU: time and peak memory against the FLOP floor.

A randomly initialised model of Llama-2-7B's shape in bf16 (timing needs no weights), random
reference prompts and counterfactuals that differ at a few operand-like positions. The floor is
bench/patching.py's FLOP count at the GPU's measured bf16 matrix-multiply rate. Writes the
figures into bench/RESULTS.md (run it where a GPU is; it refuses to run without one).

    python bench/patching_scale.py [--prompts 256] [--tokens 64] [--batch-size 32]
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from patching import flop_floor  # noqa: E402
from results import machine, provenance, write_section  # noqa: E402

from keyheads.models.model import HookedModel  # noqa: E402
from keyheads.patching.path import path_patch_batch  # noqa: E402
from keyheads.patching.samples import PatchSample, batches  # noqa: E402

SHAPES = {  # Hugging Face LlamaConfig fields of the published models
    "llama-2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32, vocab_size=32000),
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256),
}


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


def random_model(shape: str, dtype) -> HookedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096)
    torch.set_default_dtype(dtype)
    with torch.device("cuda"):
        hf = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    return HookedModel(hf, tokenizer=None, name=f"random {shape}")


def random_samples(n: int, tokens: int, vocab: int, seed: int = 0) -> list[PatchSample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ref = torch.randint(100, vocab, (tokens,), generator=g)
        cf = ref.clone()
        where = torch.randperm(tokens - 1, generator=g)[:3]      # three "operands" differ
        cf[where] = torch.randint(100, vocab, (3,), generator=g)
        out.append(PatchSample(i, ref.tolist(), cf.tolist(), int(torch.randint(100, vocab, (1,), generator=g))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-2-7b")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--mlp-chunk", type=int, default=8192, help="rows per MLP product in the sweep")
    ap.add_argument("--no-write", action="store_true", help="print only, do not update RESULTS.md")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/patching_scale.py needs a CUDA GPU (it times a 7B-shaped model in bf16)")
    dtype = torch.bfloat16
    torch.manual_seed(0)
    model = random_model(args.shape, dtype)
    weights = torch.cuda.memory_allocated()
    samples = random_samples(args.prompts, args.tokens, model.config.vocab_size)
    work = list(batches(samples, args.batch_size, model.device))
    rate = gpu_matmul_rate(model.d_model, model.config.intermediate_size, dtype)

    def sweep():
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = [path_patch_batch(model, b, "relative-logit", mlp_chunk=args.mlp_chunk) for b in work]
        torch.cuda.synchronize()
        return out, time.perf_counter() - t

    with torch.no_grad():
        path_patch_batch(model, work[0], "relative-logit", mlp_chunk=args.mlp_chunk)  # warm-up
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(3):
            out, t = sweep()
            times.append(t)
    peak = torch.cuda.max_memory_allocated()
    finite = all(torch.isfinite(r.heads).all() and torch.isfinite(r.mlps).all() for r in out)
    t_fast = min(times)
    passes, mlp_work = flop_floor(model, samples)
    floor = (passes + mlp_work) / rate
    L, H, V = model.n_layers, model.n_heads, model.config.vocab_size
    heads_x_vocab = L * H * args.batch_size * V * 2  # what one bf16 [senders x batch, vocab] logit block would take
    lines = [
        provenance("bench/patching_scale.py", machine("cuda")),
        f"- date: {datetime.date.today().isoformat()}; command: `python bench/patching_scale.py --shape {args.shape} "
        f"--prompts {args.prompts} --tokens {args.tokens} --batch-size {args.batch_size}`",
        f"- model: randomly initialised {args.shape} shape ({L} layers x {H} heads, d {model.d_model}, "
        f"d_ff {model.config.intermediate_size}, vocab {V}), bf16, on one {torch.cuda.get_device_name()}; "
        f"torch {torch.__version__}",
        f"- {args.prompts} prompts of {args.tokens} tokens, batches of {args.batch_size}; "
        f"{L * (H + 1)} senders per prompt",
        f"- fast sweep: **{t_fast:.2f} s** (best of 3; {args.prompts / t_fast:.0f} prompts/s); "
        f"all effects finite: {finite}",
        f"- FLOPs it must do: {passes / 1e12:.1f} TFLOP in the two capturing passes + {mlp_work / 1e12:.1f} TFLOP "
        f"of MLP work above the senders = {(passes + mlp_work) / 1e12:.1f} TFLOP",
        f"- measured bf16 matmul rate "
        f"([16384, {model.d_model}] x [{model.d_model}, {model.config.intermediate_size}]): "
        f"{rate / 1e12:.0f} TFLOP/s; floor {floor:.2f} s; achieved {(passes + mlp_work) / t_fast / 1e12:.0f} TFLOP/s; "
        f"**fast / floor = {t_fast / floor:.2f}**",
        f"- peak GPU memory: **{peak / 2**30:.1f} GiB**, of which weights {weights / 2**30:.1f} GiB; "
        f"for comparison, one [senders x batch, vocab] bf16 logit block "
        f"would alone take {heads_x_vocab / 2**30:.1f} GiB",
    ]
    print("\n".join(lines))
    if not args.no_write:
        # the default shape's section keeps its title, so a re-run replaces it instead of adding a second one
        scale = "7B" if args.shape == "llama-2-7b" else args.shape
        write_section(f"Path patching at {scale} scale on one GPU (bench/patching_scale.py)", "\n".join(lines))


if __name__ == "__main__":
    main()

"""Path patching's fast sweep at 7B scale on one GPU: time and peak memory against the FLOP floor.

A randomly initialised model of Llama-2-7B's shape in bf16 (timing needs no weights), random
reference prompts and counterfactuals that differ at a few operand-like positions. The floor is
bench/floors.py's FLOP count of path patching at the GPU's measured bf16 matrix-multiply rate. Writes the
figures into bench/RESULTS.md (run it where a GPU is; it refuses to run without one, but for --tiny).

    python -m bench.patching_scale [--prompts 256] [--tokens 64] [--batch-size 32]
    python -m bench.patching_scale --tiny    # a check in seconds, on the CPU: a tiny random shape in float32,
                                             # 4 prompts of 16 tokens, one timed sweep; no GPU memory to count
"""
from __future__ import annotations

import argparse
import datetime
import time

import torch

from bench import tiny
from bench.floors import gpu_matmul_rate, matmul_rate, patching_flops
from bench.results import machine, provenance, write_section
from keyheads.models.model import HookedModel
from keyheads.patching.path import path_patch_batch
from keyheads.patching.samples import PatchSample, batches

SHAPES = {  # Hugging Face LlamaConfig fields of the published models
    "llama-2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32, vocab_size=32000),
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256),
    # --tiny: the same script on the CPU, to check it before GPU time is spent
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=512),
}
TINY = {"shape": "tiny", "prompts": 4, "tokens": 16, "batch_size": 2, "repeats": 1}


def random_model(shape: str, dtype, device: str = "cuda") -> HookedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096)
    torch.set_default_dtype(dtype)
    with torch.device(device):
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
    tiny.add_flags(ap)
    ap.set_defaults(repeats=3)
    args = tiny.parse(ap, TINY)
    device = "cpu" if args.tiny else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/patching_scale.py needs a CUDA GPU (it times a 7B-shaped model in bf16)")
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    model = random_model(args.shape, dtype, device)
    weights = torch.cuda.memory_allocated() if cuda else 0
    samples = random_samples(args.prompts, args.tokens, model.config.vocab_size)
    work = list(batches(samples, args.batch_size, model.device))
    d, d_ff = model.d_model, model.config.intermediate_size
    rate = gpu_matmul_rate(d, d_ff, dtype) if cuda else matmul_rate(d, d_ff)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def sweep():
        sync()
        t = time.perf_counter()
        out = [path_patch_batch(model, b, "relative-logit", mlp_chunk=args.mlp_chunk) for b in work]
        sync()
        return out, time.perf_counter() - t

    with torch.no_grad():
        path_patch_batch(model, work[0], "relative-logit", mlp_chunk=args.mlp_chunk)  # warm-up
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.repeats):
            out, t = sweep()
            times.append(t)
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    finite = all(torch.isfinite(r.heads).all() and torch.isfinite(r.mlps).all() for r in out)
    t_fast = min(times)
    passes, mlp_work = patching_flops(model, samples)
    floor = (passes + mlp_work) / rate
    L, H, V = model.n_layers, model.n_heads, model.config.vocab_size
    heads_x_vocab = L * H * args.batch_size * V * 2  # what one bf16 [senders x batch, vocab] logit block would take
    lines = [
        provenance("bench/patching_scale.py", machine(device)),
        f"- date: {datetime.date.today().isoformat()}; command: `python -m bench.patching_scale --shape {args.shape} "
        f"--prompts {args.prompts} --tokens {args.tokens} --batch-size {args.batch_size}"
        f"{' --tiny' if args.tiny else ''}`",
        f"- model: randomly initialised {args.shape} shape ({L} layers x {H} heads, d {model.d_model}, "
        f"d_ff {model.config.intermediate_size}, vocab {V}), {'bf16' if cuda else 'fp32'}, on {machine(device)}; "
        f"torch {torch.__version__}",
        f"- {args.prompts} prompts of {args.tokens} tokens, batches of {args.batch_size}; "
        f"{L * (H + 1)} senders per prompt",
        f"- fast sweep: **{t_fast:.2f} s** (best of {args.repeats}; {args.prompts / t_fast:.0f} prompts/s); "
        f"all effects finite: {finite}",
        f"- FLOPs it must do: {passes / 1e12:.1f} TFLOP in the two capturing passes + {mlp_work / 1e12:.1f} TFLOP "
        f"of MLP work above the senders = {(passes + mlp_work) / 1e12:.1f} TFLOP",
        f"- measured {'bf16' if cuda else 'fp32'} matmul rate "
        f"([{16384 if cuda else 4096}, {model.d_model}] x [{model.d_model}, {model.config.intermediate_size}]): "
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
        write_section(f"Path patching at {scale} scale on one GPU (bench/patching_scale.py)", "\n".join(lines),
                      tiny.results_file(args))


if __name__ == "__main__":
    main()

"""Evaluation throughput on a GPU (`python -m bench.eval --gpu`): the keyheads engine, transformers
`generate` at its default and best settings, and the decode floor, side by side in one run.

A randomly initialised model of LLaMA-2-7B's shape in bf16 (timing needs no weights, and the
machine may have none) decodes 64 prompts shaped like `keyheads eval`'s 4-shot GSM8K prompts:
one shared 747-token prefix (the exemplars' length for SmolLM2's tokenizer, bench/RESULTS.md)
and questions of 30-130 tokens, random ids. Every row generates exactly 256 tokens: the model
has no EOS, so all systems do the same work and end together.

- keyheads: its engine (`generate_stream`, through keyheads.testing.oracles' `greedy_generate`, which puts the
  results in row order) with a `PrefixKV`, tokens read back every 8 steps;
- transformers `generate`, dynamic cache, left-padded batch;
- transformers `generate` with `cache_implementation="static"`, which compiles the decode step
  (mode reduce-overhead: CUDA graphs) on a GPU; timed after an untimed warm-up call.

The floor of a decode step is the larger of (weights + the key/value cache it must read, at
the measured device-to-device copy bandwidth) and (its matrix-product FLOPs at the measured
bf16 rate); the cache it must read is the prefix once plus every row's own tokens (what the
engine reads; `generate` reads the prefix once per row). Prefill is timed in every system's
wall time but not in the floor, which makes the floor a little optimistic.

A profile of a few engine decode steps (torch.profiler) gives the share of wall time the GPU
was busy and the top kernels, to say where the rest goes.
"""
from __future__ import annotations

import datetime
import time

import torch

PREFIX, QUESTIONS, NEW = 747, (30, 130), 256
DEVICE = "cuda"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class IdTokenizer:
    """What the engine asks of a tokenizer, for a model without one: ids decode to their numbers."""

    pad_token_id, eos_token_id = 0, None

    def decode(self, ids, skip_special_tokens=True) -> str:
        return " ".join(map(str, ids))


def random_model(shape: str):
    import transformers as tf

    from bench.finetune import SHAPES
    from keyheads.models.model import HookedModel

    torch.manual_seed(0)
    config = tf.LlamaConfig(max_position_embeddings=4096, eos_token_id=None, bos_token_id=None, pad_token_id=0,
                            **SHAPES[shape])
    with torch.device(DEVICE):
        hf = tf.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return HookedModel(hf, IdTokenizer(), name=f"random {shape}")


def prompts(n: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, vocab, (PREFIX,), generator=g).tolist()
    lengths = torch.randint(QUESTIONS[0], QUESTIONS[1] + 1, (n,), generator=g).tolist()
    return [prefix + torch.randint(3, vocab, (k,), generator=g).tolist() for k in lengths]


def copy_bandwidth(gib: float = 2.0) -> float:
    """Bytes/s a device-to-device copy moves (read + write), best of 10."""
    a = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=DEVICE)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(12):
        sync()
        t = time.perf_counter()
        b.copy_(a)
        sync()
        best = min(best, time.perf_counter() - t)
    return 2 * a.numel() / best


def bf16_rate(n: int = 8192) -> float:
    a = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    best = float("inf")
    for _ in range(12):
        sync()
        t = time.perf_counter()
        a @ a
        sync()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def decode_floor(model, rows: list[list[int]], bandwidth: float, rate: float) -> float:
    """Seconds the NEW decode steps need at least (see the module docstring)."""
    cfg = model.config
    params = sum(p.numel() for p in model.hf.parameters())
    d, L, kv = model.d_model, model.n_layers, model.n_kv_heads * model.head_dim
    per_token_kv = L * 2 * kv * 2  # bytes of keys and values of one token, bf16
    B, own = len(rows), [len(r) - PREFIX for r in rows]
    total = 0.0
    for t in range(NEW):
        kv_tokens = PREFIX + sum(own) + B * t
        read = params * 2 + kv_tokens * per_token_kv
        flops = 2 * B * (params - cfg.vocab_size * d * (1 if cfg.tie_word_embeddings else 0)) \
            + 4 * B * L * model.n_heads * model.head_dim * (PREFIX + sum(own) / B + t)
        total += max(read / bandwidth, flops / rate)
    return total


def timed(fn):
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t


def left_padded(rows):
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows], device=DEVICE)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=DEVICE)
    return ids, mask, width


def profile_engine(model, rows) -> list[str]:
    """Share of wall time the GPU was busy over a short engine run, and its top kernels."""
    from torch.profiler import ProfilerActivity, profile

    from keyheads.evaluation.engine import PrefixKV
    from keyheads.testing.oracles import greedy_generate

    prefix = PrefixKV(model)
    greedy_generate(model, rows, 4, None, prefix)  # the prefix computed outside the profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _, wall = timed(lambda: greedy_generate(model, rows, 32, None, prefix))
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.self_device_time_total for e in events) / 1e6
    top = sorted(events, key=lambda e: -e.self_device_time_total)[:6]
    return [f"  - profile of 32 engine steps: wall {wall:.2f} s, GPU busy {busy:.2f} s ({busy / wall:.0%}); top "
            "kernels: " + "; ".join(f"{e.key[:60]} {e.self_device_time_total / 1e6:.3f} s" for e in top)]


def main(args) -> list[str]:
    from keyheads.evaluation.engine import PrefixKV
    from keyheads.testing.oracles import greedy_generate

    model = random_model(args.shape)
    rows = prompts(args.n, model.config.vocab_size)
    ids, mask, width = left_padded(rows)
    bandwidth, rate = copy_bandwidth(), bf16_rate()
    floor = decode_floor(model, rows, bandwidth, rate)
    useful = len(rows) * NEW
    results, outputs = {}, {}
    with torch.no_grad():
        greedy_generate(model, rows[:2], 4, None, PrefixKV(model))  # warm-up
        out, results["keyheads engine (greedy_generate, shared prefix, continuous batching)"] = timed(
            lambda: greedy_generate(model, rows, NEW, None, PrefixKV(model)))
        outputs["engine"] = [text.split() for text, _ in out]

        def generate(**kw):
            return model.hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, **kw)

        out, results["transformers generate, dynamic cache"] = timed(generate)
        outputs["dynamic"] = [list(map(str, r)) for r in out[:, width:].tolist()]
        generate(cache_implementation="static")  # compiles: not timed
        out, results["transformers generate, static cache + compile (CUDA graphs)"] = timed(
            lambda: generate(cache_implementation="static"))
        outputs["static"] = [list(map(str, r)) for r in out[:, width:].tolist()]
        profile = profile_engine(model, rows)
    best_hf = min(v for k, v in results.items() if k.startswith("transformers"))
    engine_s = results["keyheads engine (greedy_generate, shared prefix, continuous batching)"]
    same = {k: sum(a == b for a, b in zip(outputs["engine"], outputs[k])) for k in ("dynamic", "static")}
    lines = [
        f"- date: {datetime.date.today()}; command: `python -m bench.eval --gpu --n {args.n}`; "
        f"{torch.cuda.get_device_name() if DEVICE == 'cuda' else DEVICE}; torch {torch.__version__}, transformers "
        f"{__import__('transformers').__version__}",
        f"- model: randomly initialised {args.shape} shape, bf16, no EOS; {len(rows)} prompts: a shared "
        f"{PREFIX}-token prefix and {QUESTIONS[0]}-{QUESTIONS[1]} own tokens each (random ids); {NEW} new tokens "
        "per row, greedy, one batch",
        f"- measured: copy bandwidth {bandwidth / 1e12:.2f} TB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s; decode "
        f"floor {floor:.2f} s ({useful / floor:.0f} tokens/s)",
        "",
        "| system | wall time | tokens/s | vs transformers' best | vs floor |",
        "|---|---|---|---|---|",
    ]
    for name, seconds in results.items():
        lines.append(f"| {name} | {seconds:.2f} s | {useful / seconds:.0f} | {best_hf / seconds:.2f}x | "
                     f"{seconds / floor:.2f}x the floor |")
    lines += [
        "",
        f"- **engine / transformers' best: {best_hf / engine_s:.2f}x** (target >= 2x); **engine / floor: "
        f"{engine_s / floor:.2f}** (target <= 2)",
        f"- greedy outputs identical to the engine's: dynamic cache {same['dynamic']} / {len(rows)}, static cache "
        f"{same['static']} / {len(rows)} rows (random bf16 weights make near-ties common; the identity check on a "
        "real model is the CPU section's)",
        *profile,
    ]
    return lines

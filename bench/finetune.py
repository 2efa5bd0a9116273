"""Fine-tuning speed and memory: precise SFT, precise + 3 MLPs, full SFT, LoRA and precise SFT's floor.

Every case trains on the same token batches (fixed-length random ids: prompt then completion, the
loss on the completion) in its own subprocess, one after the other, so that each peak memory is its
own. The floor is the forward pass plus the backward pass through the layers at and above the lowest
trained layer, with no weight gradient at all: what precise SFT cannot go below.

    python -m bench.finetune --effects runs/identify/effects.json        # SmolLM2 on CPU, top-32 key heads
    python -m bench.finetune --random-init tinyllama-1.1b --device cuda --dtype bfloat16 --from-layer 11
    python -m bench.finetune --tiny      # a check in seconds: a tiny random model, the floor and precise SFT,
                                         # 2 samples of 12 tokens, one step after one warm-up step
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench import tiny

CASES = ("floor", "precise", "precise+3mlp", "full", "lora")
# --tiny: the floor and precise SFT (the ratio between them), 4 of the tiny model's 12 heads and its 3 MLPs
TINY = {"cases": "floor,precise", "heads": 4, "steps": 1, "warmup": 1, "optimizer_batch_size": 2,
        "micro_batch_size": 1, "prompt_len": 8, "completion_len": 4}
SHAPES = {  # Llama-shaped random models for timing (no weights needed)
    "tinyllama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, vocab_size=32000),
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000),
    # the bundled SmolLM2-135M's shape (its GGUF is too large to take to a machine that cannot download it)
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
}


def build_model(args):
    from keyheads.models import load_model
    from keyheads.models.model import HookedModel
    from keyheads.testing import char_tokenizer

    if not args.random_init:
        return load_model(args.model, device=args.device, dtype=args.dtype)
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(max_position_embeddings=4096, **SHAPES[args.random_init])
    with torch.device(args.device):  # initialise where it runs: a 7B init on the CPU takes minutes
        hf = tf.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype or "float32"))
    return HookedModel(hf, char_tokenizer(), name=f"random {args.random_init}")


def components(args, model):
    from keyheads.components import Components
    from keyheads.effects import Effects

    if args.effects:
        return Components.select(Effects.load(args.effects, model), top_k=args.heads, n_mlps=3)
    import random

    # Random heads drawn from --from-layer up (where key heads sit); MLPs the three top layers of that range.
    every = [(l, h) for l in range(args.from_layer, model.n_layers) for h in range(model.n_heads)]
    heads = random.Random(0).sample(every, args.heads)
    mlps = random.Random(1).sample(range(args.from_layer, model.n_layers), 3)
    return Components(tuple(heads), tuple(mlps), f"random {args.heads} heads from layer {args.from_layer}")


def batches(args, vocab: int):
    from keyheads.finetune.data import Tokenized

    g = torch.Generator().manual_seed(0)
    n = args.optimizer_batch_size * (args.steps + args.warmup)
    ids = torch.randint(10, vocab, (n, args.prompt_len + args.completion_len), generator=g)
    return [Tokenized(row.tolist(), args.prompt_len) for row in ids]


def memory_now(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


def run_one(args) -> dict:
    """One case in this process: -> step times, peak memory, tuned parameters."""
    from keyheads.finetune.data import collate
    from keyheads.finetune.model import make_trainable
    from keyheads.finetune.settings import FinetuneSettings
    from keyheads.finetune.train import completion_loss_sum, train

    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_model(args)
    chosen = components(args, model)
    if args.one == "precise":
        chosen = chosen.with_mlps(())
    data = batches(args, model.config.vocab_size)
    base_memory = memory_now(args.device)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    method = "precise" if args.one.startswith("precise") or args.one == "floor" else args.one
    cfg = FinetuneSettings(method=method, optimizer_batch_size=args.optimizer_batch_size,
                           micro_batch_size=args.micro_batch_size,
                         max_steps=args.steps + args.warmup, save_every=0, lr=2e-5, max_length=10**6)
    out = {"case": args.one, "components": chosen.to_json(), "lowest_layer": chosen.lowest_layer(),
           "n_layers": model.n_layers}
    if args.one == "floor":
        model.hf.requires_grad_(False)
        lowest = model.layers[chosen.lowest_layer()]

        def make_leaf(module, a, kw):  # the residual stream entering the lowest trained layer needs a gradient
            if a:
                return (a[0].detach().requires_grad_(True),) + a[1:], kw
            kw["hidden_states"] = kw["hidden_states"].detach().requires_grad_(True)
            return a, kw

        lowest.register_forward_pre_hook(make_leaf, with_kwargs=True)
        times = []
        pad = model.tokenizer.pad_token_id
        for step in range(args.steps + args.warmup):
            t0 = time.perf_counter()
            batch = data[step * args.optimizer_batch_size:(step + 1) * args.optimizer_batch_size]
            tokens = sum(len(t.ids) - t.n_prompt for t in batch)
            for i in range(0, len(batch), args.micro_batch_size):
                inputs = collate(batch[i:i + args.micro_batch_size], pad, model.device)
                labels = inputs.pop("labels")
                (completion_loss_sum(model.hf(**inputs, use_cache=False).logits, labels) / tokens).backward()
            float(tokens)  # nothing to step
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out.update(step_seconds=times, tuned_params=0)
    else:
        tuned = make_trainable(model, cfg, chosen if method == "precise" else None)
        result = train(tuned, data, cfg, Path(args.scratch) / args.one, {}, progress=False)
        out.update(step_seconds=result.step_seconds, tuned_params=tuned.n_trainable)
    out.update(peak_gib=memory_now(args.device), model_gib=base_memory)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="bundled name or model folder (default: smollm2-135m; with --tiny, a tiny "
                   "random Llama)")
    p.add_argument("--random-init", choices=sorted(SHAPES), help="time a randomly initialised model of this shape")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--effects", help="effects.json: train its top --heads heads (+ top-3 MLPs)")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--from-layer", type=int, default=0, help="without --effects: random heads from this layer up")
    p.add_argument("--steps", type=int, default=3, help="timed steps, after --warmup steps")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--optimizer-batch-size", type=int, default=16, help="samples per optimizer step")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=96)
    p.add_argument("--completion-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--no-write", action="store_true", help="print only; do not update bench/RESULTS.md")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--scratch", default="/tmp/keyheads-bench-finetune", help=argparse.SUPPRESS)
    tiny.add_flags(p)
    args = tiny.parse(p, TINY)
    if args.one:
        print("RESULT " + json.dumps(run_one(args)), flush=True)
        return
    if not args.random_init:  # every case's process loads the same model
        args.model = args.model or (str(tiny.model_folder()) if args.tiny else "smollm2-135m")
    rows = {}
    for case in args.cases.split(","):
        # each case in a process of its own, so that its peak memory is its own
        cmd = [sys.executable, "-m", "bench.finetune", "--one", case, *sys.argv[1:]]
        cmd += ["--model", args.model] if args.model else []
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
        if proc.returncode or line is None:  # out of memory, say: recorded, and the other cases still run
            reason = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
            print(f"{case}: failed: {reason}", flush=True)
            rows[case] = {"failed": reason}
            continue
        rows[case] = json.loads(line[len("RESULT "):])
        r = rows[case]
        r["step"] = statistics.median(r["step_seconds"][args.warmup:])
        print(f"{case:14s} {r['step']:.3f} s/step  {args.optimizer_batch_size / r['step']:.2f} samples/s  "
              f"peak {r['peak_gib']:.2f} GiB  tuned {r['tuned_params']:,}", flush=True)
    report(args, rows)


def report(args, rows: dict) -> None:
    from bench.results import machine, provenance, write_section

    failed = {c: r["failed"] for c, r in rows.items() if "failed" in r}
    rows = {c: r for c, r in rows.items() if "failed" not in r}
    first = next(iter(rows.values()))
    what = args.random_init and f"random-init {args.random_init}" or args.model
    device = (
        torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else f"CPU ({platform.processor() or platform.machine()})"
    )
    where = machine(args.device, None if args.device.startswith("cuda") else args.threads or torch.get_num_threads())
    lines = [provenance("bench/finetune.py", where), "",
             f"Measured {datetime.date.today()} on {device}, {what} in {args.dtype or 'float32'}: "
             f"{args.optimizer_batch_size} samples per step ({args.micro_batch_size} per forward pass), "
             f"{args.prompt_len} prompt + {args.completion_len} completion tokens each, median of {args.steps} "
             f"steps after {args.warmup} warm-up step(s). Heads: {first['components']['source']}; lowest trained layer "
             f"{first['lowest_layer']} of {first['n_layers']}.", "",
             "| case | s/step | samples/s | peak memory | tuned params |", "|---|---|---|---|---|"]
    for case, r in rows.items():
        lines.append(
            f"| {case} | {r['step']:.3f} | {args.optimizer_batch_size / r['step']:.2f} | {r['peak_gib']:.2f} GiB | "
            f"{r['tuned_params']:,} |"
        )
    ratios = []
    if {"precise", "floor"} <= set(rows):
        ratios.append(
            f"precise step / its floor: **{rows['precise']['step'] / rows['floor']['step']:.2f}x** (target 1.2x)"
        )
    if {"precise", "full"} <= set(rows):
        ratios.append(
            f"precise peak memory / full SFT's: **{rows['precise']['peak_gib'] / rows['full']['peak_gib']:.0%}** "
            "(target 50%)"
        )
        ratios.append(f"speed precise / full SFT: **{rows['full']['step'] / rows['precise']['step']:.2f}x**")
    if {"precise", "lora"} <= set(rows):
        ratios.append(f"speed precise / LoRA: **{rows['lora']['step'] / rows['precise']['step']:.2f}x**")
    if {"precise+3mlp", "precise"} <= set(rows):
        ratios.append(f"speed precise+3 MLPs / precise: {rows['precise']['step'] / rows['precise+3mlp']['step']:.2f}x")
    lines += [f"| {case} | failed: {why} | | | |" for case, why in failed.items()]
    lines += [""] + [f"- {r}" for r in ratios]
    lines += ["", "Command: `python -m bench.finetune " + " ".join(sys.argv[1:]) + "`"]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section(
            f"Fine-tuning speed and memory: {what} on {'GPU' if args.device.startswith('cuda') else 'CPU'}", body,
            tiny.results_file(args),
        )


if __name__ == "__main__":
    main()

"""Why a knockout row takes longer than the base row on the same word problems: more tokens, or slower tokens?

Both rows run through keyheads' evaluation (a fresh cache each, so nothing is read back) on the same first N
items, one after the other in this process. For each row: wall seconds, the tokens it generated (its
outputs tokenised again), seconds per generated token, and how many items ran into the token budget
instead of stopping at a complete answer.

    python -m bench.knockout_rows [--n 24] [--benchmark addsub] [--threads 2] [--data-dir BENCHMARKS]
    python -m bench.knockout_rows --tiny [--data-dir BENCHMARKS]   # a check in seconds: a tiny random model,
                                                                   # 2 items, 3 heads, 16 new tokens
"""
from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import tiny
from bench.results import machine, provenance, write_section
from keyheads.data.benchmarks import data_dir_from
from keyheads.evaluation import EvalSettings, Variant, evaluate
from keyheads.evaluation.cache import read_rows
from keyheads.models import load_model

MODEL = "smollm2-135m"
# The ten heads of the knockout illustration in studies/RESULTS.md ("Knockout row"), from an addition knockout run.
HEADS = "21.2,23.3,18.3,24.4,20.4,27.7,23.0,20.3,17.5,20.2"
# --tiny: heads the tiny model has, a few pairs for the knockout's mean, one exemplar (prompts spelt character by
# character stay short), a small generation budget, one thread
TINY = {"n": 2, "heads": "0.0,1.1,2.2", "pairs": 8, "few_shot": 1, "new_tokens": 16, "threads": 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--benchmark", default="addsub")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data-dir")
    ap.add_argument("--model", help="bundled name or model folder (default: smollm2-135m; with --tiny, a tiny "
                    "random Llama)")
    ap.add_argument("--heads", default=HEADS, help="the heads knocked out, LAYER.HEAD,...")
    tiny.add_flags(ap)
    ap.set_defaults(pairs=120, few_shot=None, new_tokens=None)  # the evaluation's own exemplars and budget
    args = tiny.parse(ap, TINY)
    torch.set_num_threads(args.threads)
    data_dir = data_dir_from(args.data_dir)
    work = Path(tempfile.mkdtemp(prefix="keyheads-korows-"))
    pairs = work / "pairs.jsonl"
    name = args.model or (str(tiny.model_folder()) if args.tiny else MODEL)
    subprocess.run([str(Path(sys.executable).with_name("keyheads")), "data", "--model", name, "--task", "addition",
                    "-n", str(args.pairs), "--out", str(pairs), "--quiet"], check=True)
    model = load_model(name, device="cpu", dtype="float32")
    heads = [[int(x) for x in h.split(".")] for h in args.heads.split(",")]
    variants = {"base": Variant.make("model", name),
                # the global mean, as this section was measured and says (eval's default is now the aligned one)
                "knockout": Variant.make("knockout", name, heads=heads, data=str(pairs), mean="global")}
    rows = []
    for row, variant in variants.items():
        cache = work / f"cache-{row}"
        cfg = EvalSettings(benchmarks=(args.benchmark,), limit=args.n, few_shot=args.few_shot,
                           max_new_tokens=args.new_tokens)
        t0 = time.perf_counter()
        evaluate([variant], cfg, work / f"out-{row}", loader=lambda _: model, data_dir=str(data_dir),
                 cache_dir=str(cache), progress=False)
        seconds = time.perf_counter() - t0
        done = read_rows(cache / f"{args.benchmark}.sqlite")
        outputs, finishes = [r["output"] for r in done], [r["finish"] for r in done]
        tokens = sum(len(model.tokenizer(o, add_special_tokens=False)["input_ids"]) for o in outputs)
        rows.append((row, seconds, len(outputs), tokens, finishes.count("length")))
    table = ["| row | seconds | items | generated tokens | tokens per item | ms per generated token | "
             "items that hit the budget |", "|---|---:|---:|---:|---:|---:|---:|"]
    for row, seconds, items, tokens, budget in rows:
        table.append(f"| {row} | {seconds:.1f} | {items} | {tokens:,} | {tokens / items:.0f} | "
                     f"{1000 * seconds / tokens:.1f} | {budget} |")
    (_, s_base, _, t_base, _), (_, s_ko, _, t_ko, _) = rows
    command = f"python -m bench.knockout_rows --n {args.n} --benchmark {args.benchmark} --threads {args.threads}" + (
        " --tiny" if args.tiny else "")
    body = provenance("bench/knockout_rows.py", machine(threads=args.threads)) + "\n\n" + "\n".join(table) + f"""

{model.name}, {args.benchmark}, the first {args.n} items, {cfg.shots(args.benchmark)}-shot chain of thought,
fp32 on CPU, {args.threads} threads; knockout of {args.heads} (global mean over {pairs.name}'s counterfactual
prompts). The knockout row took {s_ko / s_base:.2f}x the base row's time; it generated {t_ko / t_base:.2f}x
the tokens, at {(s_ko / t_ko) / (s_base / t_base):.2f}x the time per token. Measured
{datetime.date.today().isoformat()} with `{command}`."""
    write_section("Knockout rows against base rows: tokens or time per token (bench/knockout_rows.py)", body,
                  tiny.results_file(args))
    print(body)


if __name__ == "__main__":
    main()

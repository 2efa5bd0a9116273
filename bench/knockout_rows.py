"""Why a knockout row takes longer than the base row on the same word problems: more tokens, or slower tokens?

Both rows run through keyheads' evaluation (a fresh cache each, so nothing is read back) on the same first N
items, one after the other in this process. For each row: wall seconds, the tokens it generated (its
outputs tokenised again), seconds per generated token, and how many items ran into the token budget
instead of stopping at a complete answer.

    python bench/knockout_rows.py [--n 24] [--benchmark addsub] [--threads 2] [--data-dir BENCHMARKS]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from results import machine, provenance, write_section  # noqa: E402

from keyheads.data.benchmarks import data_dir_from  # noqa: E402
from keyheads.evaluation import EvalSettings, Variant, evaluate  # noqa: E402
from keyheads.evaluation.cache import read_rows  # noqa: E402
from keyheads.models import load_model  # noqa: E402

MODEL = "smollm2-135m"
# The ten heads of the knockout illustration in studies/RESULTS.md ("Knockout row"), from an addition knockout run.
HEADS = "21.2,23.3,18.3,24.4,20.4,27.7,23.0,20.3,17.5,20.2"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--benchmark", default="addsub")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data-dir")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data_dir = data_dir_from(args.data_dir)
    work = Path(tempfile.mkdtemp(prefix="keyheads-korows-"))
    pairs = work / "pairs.jsonl"
    subprocess.run([str(Path(sys.executable).with_name("keyheads")), "data", "--model", MODEL, "--task", "addition",
                    "-n", "120", "--out", str(pairs), "--quiet"], check=True)
    model = load_model(MODEL, device="cpu", dtype="float32")
    heads = [[int(x) for x in h.split(".")] for h in HEADS.split(",")]
    variants = {"base": Variant.make("model", MODEL),
                # the global mean, as this section was measured and says (eval's default is now the aligned one)
                "knockout": Variant.make("knockout", MODEL, heads=heads, data=str(pairs), mean="global")}
    rows = []
    for name, variant in variants.items():
        cache = work / f"cache-{name}"
        cfg = EvalSettings(benchmarks=(args.benchmark,), limit=args.n)
        t0 = time.perf_counter()
        evaluate([variant], cfg, work / f"out-{name}", loader=lambda _: model, data_dir=str(data_dir),
                 cache_dir=str(cache), progress=False)
        seconds = time.perf_counter() - t0
        done = read_rows(cache / f"{args.benchmark}.sqlite")
        outputs, finishes = [r["output"] for r in done], [r["finish"] for r in done]
        tokens = sum(len(model.tokenizer(o, add_special_tokens=False)["input_ids"]) for o in outputs)
        rows.append((name, seconds, len(outputs), tokens, finishes.count("length")))
    table = ["| row | seconds | items | generated tokens | tokens per item | ms per generated token | "
             "items that hit the budget |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, seconds, items, tokens, budget in rows:
        table.append(f"| {name} | {seconds:.1f} | {items} | {tokens:,} | {tokens / items:.0f} | "
                     f"{1000 * seconds / tokens:.1f} | {budget} |")
    (_, s_base, _, t_base, _), (_, s_ko, _, t_ko, _) = rows
    body = provenance("bench/knockout_rows.py", machine(threads=args.threads)) + "\n\n" + "\n".join(table) + f"""

{MODEL}, {args.benchmark}, the first {args.n} items, 4-shot chain of thought, fp32 on CPU, {args.threads} threads;
knockout of {HEADS} (global mean over {pairs.name}'s counterfactual prompts). The knockout row took
{s_ko / s_base:.2f}x the base row's time; it generated {t_ko / t_base:.2f}x the tokens, at
{(s_ko / t_ko) / (s_base / t_base):.2f}x the time per token. Measured {datetime.date.today().isoformat()} with
`python bench/knockout_rows.py --n {args.n} --benchmark {args.benchmark} --threads {args.threads}`."""
    write_section("Knockout rows against base rows: tokens or time per token (bench/knockout_rows.py)", body)
    print(body)


if __name__ == "__main__":
    main()

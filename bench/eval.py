"""Evaluation throughput: keyheads' engine against transformers `generate` on the same GSM8K prompts.

Both systems take the first N GSM8K test prompts exactly as `keyheads eval` builds them (4-shot
chain of thought, GSM8K-train exemplars, the runner's order and batches) and decode greedily with
the same budget (256 new tokens) and the same stop rule (`cut_at_stop`: a blank line, "Question:"
or a complete "The answer is N"), each row stopping as soon as its text is complete:

- keyheads: its engine (`generate_stream`, through keyheads.testing.oracles' `greedy_generate`) with a
  shared-prefix `PrefixKV`, as the evaluation runs it: every prompt in one call, at most --batch-size
  rows in flight, a finished row's place taken by the next;
- transformers: `model.generate`, batched and left-padded, do_sample=False, with a StoppingCriteria
  that applies the same stop function to each row's decoded text (finished rows are padded until
  the whole batch is done, which is how `generate` works);
- lm-evaluation-harness (when installed): its HF backend's `generate_until` with the stop strings,
  its text then cut with the same stop function.

Useful tokens are the tokens a row needs until its stop fires (the end-of-sequence token included
when it ends that way); tokens/s = useful tokens / wall time. The final texts must be identical.
The CPU time other processes took meanwhile is reported with the figures: time it on an idle machine.

    python -m bench.eval [--n 64] [--batch-size 16] [--threads 2] [--data-dir BENCHMARKS] [--no-write]
    python -m bench.eval --tiny [--data-dir BENCHMARKS]    # a check in seconds: a tiny random model, 2 prompts,
                                                           # one exemplar, 16 new tokens

With --gpu it times a 7B-shaped random model on a GPU instead (bench/eval_gpu.py says how):

    python -m bench.eval --gpu [--n 64] [--shape llama2-7b]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import time
from pathlib import Path

import torch

from bench import tiny
from bench.results import machine, provenance, publish, write_section
from keyheads.data.benchmarks import data_dir_from
from keyheads.evaluation.engine import PrefixKV, common_prefix_len, eos_ids
from keyheads.evaluation.prompts import STOPS, cut_at_stop
from keyheads.evaluation.runner import batches
from keyheads.evaluation.settings import EvalSettings
from keyheads.evaluation.tasks import make_task, prompt_ids
from keyheads.models import load_model
from keyheads.testing.oracles import greedy_generate

ROOT = Path(__file__).resolve().parents[1]
BENCH = "gsm8k"
# --tiny: one exemplar, so that GSM8K's prompts spelt character by character stay short, a small budget, one thread
TINY = {"n": 2, "batch_size": 2, "few_shot": 1, "new_tokens": 16, "threads": 1}


def finish_row(tok, generated: list[int], eos: set[int], budget: int) -> tuple[str, str, int]:
    """(text cut at the stop, why, useful tokens) of one row of generated ids, by greedy_generate's rules."""
    for j, token in enumerate(generated[:budget], 1):
        if token in eos:
            return tok.decode(generated[:j - 1], skip_special_tokens=True), "eos", j
        text = tok.decode(generated[:j], skip_special_tokens=True)
        cut = cut_at_stop(text)
        if cut is not None:
            return text[:cut], "stop", j
    return tok.decode(generated[:budget], skip_special_tokens=True), "length", min(len(generated), budget)


class Engine:
    """keyheads, as the evaluation runs it: one PrefixKV, every item in one call that keeps batch_size in flight."""

    def __init__(self, model, budget: int, batch_size: int):
        self.model, self.budget, self.batch_size = model, budget, batch_size
        self.prefix, self.calls = PrefixKV(model), 0

    def stop(self, text: str) -> int | None:  # called once per generated (non-EOS) token of a live row
        self.calls += 1
        return cut_at_stop(text)

    def __call__(self, batch) -> list[tuple[str, str]]:
        return greedy_generate(self.model, prompt_ids(self.model, [it.prompt for it in batch]), self.budget, self.stop,
                               self.prefix, batch_size=self.batch_size)

    def tokens(self, outs: list[tuple[str, str]]) -> int:
        return self.calls + sum(why == "eos" for _, why in outs)


class HFGenerate:
    """transformers generate, batched and left-padded, stopped per row by the same stop function."""

    def __init__(self, model, budget: int):
        from transformers import StoppingCriteria

        self.model, self.budget, self.eos = model, budget, eos_ids(model)
        tok, eos = model.tokenizer, self.eos
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos))
        self.useful = 0

        class StopAtCut(StoppingCriteria):
            """True for a row once cut_at_stop finds its answer complete (finished rows are not decoded again)."""

            def __init__(self, start: int, rows: int):
                self.start, self.done = start, [False] * rows

            def __call__(self, input_ids, scores, **kwargs):
                for b, row in enumerate(input_ids[:, self.start:].tolist()):
                    if not self.done[b] and row[-1] not in eos:
                        self.done[b] = cut_at_stop(tok.decode(row, skip_special_tokens=True)) is not None
                return torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)

        self.criterion = StopAtCut

    def __call__(self, batch) -> list[tuple[str, str]]:
        from transformers import StoppingCriteriaList

        model, tok = self.model, self.model.tokenizer
        rows = prompt_ids(model, [it.prompt for it in batch])
        width = max(map(len, rows))
        ids = torch.tensor([[self.pad] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        out = model.hf.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                                max_new_tokens=self.budget, do_sample=False, pad_token_id=self.pad,
                                stopping_criteria=StoppingCriteriaList([self.criterion(width, len(rows))]))
        finished = [finish_row(tok, g, self.eos, self.budget) for g in out[:, width:].tolist()]
        self.useful += sum(n for *_, n in finished)
        return [(text, why) for text, why, _ in finished]


def timed(fn, batch, clock: list[float]):
    start = time.perf_counter()
    out = fn(batch)
    clock.append(time.perf_counter() - start)
    return out


def cpu_seconds() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, of this process) so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        user, nice, system = (int(x) for x in f.readline().split()[1:4])
    own = resource.getrusage(resource.RUSAGE_SELF)
    return (user + nice + system) / ticks, own.ru_utime + own.ru_stime


def run_lm_eval(model, items, budget: int, batch_size: int) -> tuple[list[str], float] | None:
    """lm-evaluation-harness' HF backend (generate_until with the stop strings); None when not installed."""
    try:
        from lm_eval.api.instance import Instance
        from lm_eval.models.huggingface import HFLM
    except ImportError:
        return None
    lm = HFLM(pretrained=model.hf, tokenizer=model.tokenizer, batch_size=batch_size)
    kwargs = {"until": list(STOPS), "max_gen_toks": budget, "do_sample": False}
    requests = [Instance(request_type="generate_until", doc={}, arguments=(it.prompt, dict(kwargs)), idx=i)
                for i, it in enumerate(items)]
    start = time.perf_counter()
    texts = lm.generate_until(requests)
    seconds = time.perf_counter() - start
    return [t[:c] if (c := cut_at_stop(t)) is not None else t for t in texts], seconds


def first_diff(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64, help="first N GSM8K test questions")
    ap.add_argument("--batch-size", type=int, default=16,
                    help="prompts per batch (default: the runner's)")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--data-dir", help="benchmarks folder (default: $KEYHEADS_DATA, else ../shared/data/benchmarks "
                    "beside the checkout)")
    ap.add_argument("--no-write", action="store_true", help="print only, do not update RESULTS.md")
    ap.add_argument("--no-harness", action="store_true", help="leave lm-evaluation-harness out")
    ap.add_argument("--gpu", action="store_true", help="the GPU mode: a random model of --shape, bf16")
    ap.add_argument("--shape", default="llama2-7b", help="with --gpu: a shape of bench/finetune.py's SHAPES")
    ap.add_argument("--model", help="bundled name or model folder (default: smollm2-135m; with --tiny, a tiny "
                    "random Llama)")
    tiny.add_flags(ap)
    ap.set_defaults(few_shot=None, new_tokens=None)  # the evaluation's own: 4 exemplars, 256 new tokens
    args = tiny.parse(ap, TINY)
    torch.set_num_threads(args.threads)
    if args.gpu:
        from bench import eval_gpu

        lines = [provenance("bench/eval.py --gpu", machine(eval_gpu.DEVICE)), *eval_gpu.main(args)]
        print("\n".join(lines))
        if not args.no_write:
            write_section("Evaluation throughput on a GPU (bench/eval.py --gpu)", "\n".join(lines),
                          tiny.results_file(args))
        return

    data_dir = data_dir_from(args.data_dir)
    if data_dir is None and (ROOT.parent / "shared" / "data" / "benchmarks").is_dir():
        data_dir = ROOT.parent / "shared" / "data" / "benchmarks"
    cfg = EvalSettings(benchmarks=(BENCH,), limit=args.n, few_shot=args.few_shot, max_new_tokens=args.new_tokens)
    model = load_model(args.model or (str(tiny.model_folder()) if args.tiny else "smollm2-135m"), device="cpu",
                       dtype="float32")
    model.hf.eval()
    task = make_task(BENCH, cfg, str(data_dir) if data_dir else None)
    budget = cfg.new_tokens(BENCH)
    # the runner's order and batches: by prompt length within a group, at most batch_size per batch
    items = sorted(task.items, key=lambda it: (task.group(it), len(it.prompt), it.prompt))
    runs = batches(items, args.batch_size, task.group)
    rows = prompt_ids(model, [it.prompt for it in items])
    lengths, shared = [len(r) for r in rows], common_prefix_len(rows)

    engine, hf = Engine(model, budget, args.batch_size), HFGenerate(model, budget)
    clock_engine: list[float] = []
    clock_hf: list[float] = []
    with torch.no_grad():
        Engine(model, 4, args.batch_size)(runs[0])  # warm-up, not timed
        HFGenerate(model, 4)(runs[0])
        machine0, own0 = cpu_seconds()
        engine_out = timed(engine, items, clock_engine)  # every item in one call, as the runner does
        hf_out = []
        for batch in runs:
            hf_out += timed(hf, batch, clock_hf)
        machine1, own1 = cpu_seconds()
        harness = None if args.no_harness else run_lm_eval(model, items, budget, args.batch_size)
    t_engine, t_hf = sum(clock_engine), sum(clock_hf)
    engine_tokens, hf_tokens = engine.tokens(engine_out), hf.useful
    others = max(0.0, (machine1 - machine0) - (own1 - own0))  # CPU time other processes took meanwhile

    same = [a[0] == b[0] for a, b in zip(engine_out, hf_out)]
    same_finish = sum(a[1] == b[1] for a, b in zip(engine_out, hf_out))
    finishes = {w: sum(why == w for _, why in engine_out) for w in ("stop", "eos", "length")}
    rate_engine, rate_hf = engine_tokens / t_engine, hf_tokens / t_hf
    ratio = rate_engine / rate_hf
    command = f"python -m bench.eval --n {args.n} --batch-size {args.batch_size} --threads {args.threads}" + (
        " --tiny" if args.tiny else "")
    lines = [
        provenance("bench/eval.py", machine(threads=torch.get_num_threads())),
        f"- date: {datetime.date.today().isoformat()}; command: `{command}`",
        f"- model: {model.name} (fp32, CPU, {torch.get_num_threads()} threads, {platform.machine()}); "
        f"torch {torch.__version__}, transformers {__import__('transformers').__version__}",
        f"- {len(items)} GSM8K test prompts as `keyheads eval` builds them ({cfg.shots(BENCH)}-shot chain of thought, "
        f"exemplars {', '.join(e.id for e in task.exemplars)}), {len(runs)} batches of <= {args.batch_size} in the "
        f"runner's order; prompt lengths {min(lengths)}-{max(lengths)} tokens, {shared} shared by all; greedy, at most "
        f"{budget} new tokens, each row stopped by `cut_at_stop` ({finishes['stop']} stop, {finishes['eos']} EOS, "
        f"{finishes['length']} at the budget)",
        "- transformers: `model.generate(do_sample=False)`, left-padded batches, the same stop function as a "
        "StoppingCriteria per row (a finished row waits, padded, for its batch); useful tokens counted to each "
        "row's stop (EOS included); keyheads takes every prompt in one call and keeps a batch of "
        f"{args.batch_size} in flight (a row that ends makes room for the next), as `keyheads eval` runs it; "
        "after one untimed warm-up batch each",
        f"- transformers per batch: {', '.join(f'{b:.0f} s' for b in clock_hf)}; "
        f"other processes used {others:.0f} CPU-seconds of the {os.cpu_count()} cores during the "
        f"{t_engine + t_hf:.0f} s timed",
        "",
        "| system | wall time | useful tokens | tokens/s |",
        "|---|---|---|---|",
        f"| keyheads engine (greedy_generate, shared prefix, continuous batching) | {t_engine:.1f} s | "
        f"{engine_tokens} | {rate_engine:.1f} |",
        f"| transformers generate (batched, left-padded) | {t_hf:.1f} s | {hf_tokens} | {rate_hf:.1f} |",
    ]
    if harness is None:
        why = "left out (--no-harness)" if args.no_harness else "not installed"
        lines.append(f"| lm-evaluation-harness HF backend | {why} | - | - |")
    else:
        texts, t_lm = harness
        lm_same = sum(a[0] == b for a, b in zip(engine_out, texts))
        # lm-eval returns text only: its useful tokens are the engine's for the same (identical) outputs
        lines.append(f"| lm-evaluation-harness HF backend | {t_lm:.1f} s | {engine_tokens} | "
                     f"{engine_tokens / t_lm:.1f} |")
    lines += [
        "",
        f"- **engine / transformers: {ratio:.2f}x** tokens/s (target >= 3x)",
        f"- **identical final texts: {sum(same)} / {len(same)}** (finish reasons equal: {same_finish} / {len(same)})",
    ]
    if harness is not None:
        lines.append(f"- lm-evaluation-harness, identical to the engine: {lm_same} / {len(same)}")
    differ = [i for i, s in enumerate(same) if not s]
    if differ:
        i = differ[0]
        a, b = engine_out[i][0], hf_out[i][0]
        at = first_diff(a, b)
        lines.append(f"- first difference, item {items[i].record.id} at character {at}: engine "
                     f"{a[max(0, at - 40):at + 40]!r} vs transformers {b[max(0, at - 40):at + 40]!r}")
    print("\n".join(lines))
    ok = ratio >= 3 and not differ
    print("targets met" if ok else "TARGETS NOT MET")
    if not args.no_write:
        figures = {"prompts": len(items), "batches": len(runs), "new_tokens": budget,
                   "seconds_engine": round(t_engine, 3), "seconds_generate": round(t_hf, 3),
                   "tokens_engine": engine_tokens, "tokens_generate": hf_tokens, "ratio": round(ratio, 4),
                   "identical_texts": sum(same), "other_cpu_seconds": round(others, 1),
                   "seconds_harness": None if harness is None else round(harness[1], 3)}
        publish("Evaluation throughput: keyheads engine vs transformers generate (bench/eval.py)", "bench.eval",
                "eval", figures, lines, tiny.results_file(args))


if __name__ == "__main__":
    main()

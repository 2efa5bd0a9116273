"""Knockout curves: the direct method against the batched END-only passes, on two kinds of data.

- demo: the demo's pairs (four addition templates, a three-example prefix shared per template);
- shared-prefix: one template behind one three-example prefix, a few dozen prompts whose own
  tokens are a handful each, so that a knockout set's own work is small and overheads show.

On each, both methods run in one process on the same model, prompts, means and knockout
sets. Prints both times, their ratio and whether every accuracy is the same, and the batched
passes' time against their FLOP floor: the work they must do (the clean prefix and the layers
below a set's lowest knocked-out layer once; each set's prefix and prompts from that layer up,
since knocking a head out changes the prefix's keys and values there too; logits at END only),
at this machine's matrix-multiply rate. Writes the figures into bench/RESULTS.md.

    python -m bench.analysis [--k 12] [--seeds 5] [--effects effects.json] [--cases demo,shared-prefix]
    python -m bench.analysis --tiny     # a check in seconds: a tiny random model, 8 candidate pairs a case, k 2

With --gpu it times the curves of a 7B-shaped random model on a GPU instead (bench/analysis_gpu.py):

    python -m bench.analysis --gpu [--prompts 256] [--k 32] [--seeds 5]
"""
from __future__ import annotations

import argparse
import datetime
import platform
import tempfile
import time
from pathlib import Path

import torch

from bench import tiny
from bench.floors import knockout_flops, matmul_rate
from bench.results import machine, provenance, publish, write_section
from keyheads.analysis.common import all_heads, load_samples
from keyheads.analysis.knockout_curves import CurveSettings, curve_sets, knockout_curves
from keyheads.analysis.passes import EndPasses
from keyheads.cli import main as cli
from keyheads.demo import demo_config
from keyheads.effects import Effects
from keyheads.knockout import compute_means
from keyheads.models import load_model
from keyheads.models.prompt_set import PromptSet
from keyheads.runfolder import RunFolder
from keyheads.testing.oracles import Batches, direct_curves

CASES = {
    # name: (what RESULTS says about the data, overrides of the demo's data settings)
    "demo": ("the demo's data: addition prompts of four templates, three-example prefix shared per template", {}),
    "shared-prefix": ("one template (add-eq-1) behind one three-example prefix, the prompts' own tokens a few each",
                      {"templates": ["add-eq-1"], "n": 64}),
}
# --tiny: a few candidate pairs of any answer (a random model gets none right), short curves, one random order, one
# thread
TINY = {"k": 2, "seeds": 1, "batch_size": 4, "pairs": 8, "keep_correct": False, "threads": 1}


def make_data(folder: Path, overrides: dict, model: str = "smollm2-135m", keep_correct: bool = True) -> Path:
    """The pairs the demo makes (same templates, n, few-shot prefix, seed) with `overrides` on top."""
    cfg = demo_config({"model": model, "out": str(folder), "device": "cpu", "dtype": "float32",
                       "data": overrides})
    data = RunFolder(folder).pairs
    args = ["data", "--model", model, "--task", cfg.data.task, "-n", str(cfg.data.n), "--few-shot",
            str(cfg.data.few_shot), *(["--keep-correct"] if keep_correct else []), "--single-token-answer",
            "--seed", str(cfg.seed), "--out", str(data), "--quiet"]
    args += ["--shared-prefix"] if cfg.data.shared_prefix else []
    if cfg.data.templates:
        args += ["--templates", ",".join(cfg.data.templates)]
    if cli(args):
        raise SystemExit("could not make the pairs")
    return data


def run_case(name: str, args, model) -> tuple[list[str], dict]:
    """Both methods on one case's data -> (the lines RESULTS gets, the figures its record keeps)."""
    described, overrides = CASES[name]
    folder = Path(tempfile.mkdtemp())
    overrides = {**overrides, "n": args.pairs} if args.pairs else overrides
    data = make_data(folder, overrides, model.name, args.keep_correct)
    effects_path = args.effects if name == "demo" else None
    if effects_path is None:
        if cli(["identify", "--model", model.name, "--data", str(data), "--first-token", "--top-k", "8",
                "--out", str(RunFolder(folder).identify), "--quiet"]):
            raise SystemExit("path patching failed")
        effects_path = RunFolder(folder).effects
    samples = load_samples(model, data)
    refs, answers = [s.prompt for s in samples], [s.answer_id for s in samples]
    heads = all_heads(model)
    cfg = CurveSettings(k=args.k, seeds=args.seeds, seed=0)
    ranked = Effects.load(effects_path, model).ranked()
    rates = [matmul_rate(model.d_model, model.config.intermediate_size)]  # the best of three, around the timings
    with torch.inference_mode():
        full = compute_means(model, [s.counterfactual for s in samples], heads=heads, batch_size=args.batch_size,
                             progress=False)

        t = time.perf_counter()
        slow = direct_curves(model, Batches(model, refs, args.batch_size), answers, full, ranked, heads, cfg)
        t_direct = time.perf_counter() - t
        rates.append(matmul_rate(model.d_model, model.config.intermediate_size))

        t = time.perf_counter()
        prompts = PromptSet(model, refs, args.batch_size)
        fast = knockout_curves(model, prompts, answers, full, ranked, heads, cfg, progress=False)
        t_fast = time.perf_counter() - t

        # the same passes once more, counting their work (knockout_curves does not expose it)
        engine = EndPasses(model, prompts, full)
        engine.logits(curve_sets(ranked, heads, cfg)[0], lambda *_: None)

    n = len(refs)
    points = lambda c: c.effect + sum(c.random, [])  # noqa: E731
    diff = max(abs(round(a * n) - round(b * n)) for a, b in zip(points(fast), points(slow)))
    rate = max(rates + [matmul_rate(model.d_model, model.config.intermediate_size)])
    need = knockout_flops(model, engine.work)
    floor = need / rate
    direct_tokens = sum(len(model.tokens(p, add_special_tokens=True)) for p in refs) * len(points(fast))
    sizes = sorted(len(g.index) for g in prompts.groups)
    own = sorted({g.length - len(g.prefix) for g in prompts.groups})
    prefixes = sorted({len(g.prefix) for g in prompts.groups})
    figures = {"prompts": n, "groups": len(prompts.groups), "seconds_direct": round(t_direct, 4),
               "seconds_batched": round(t_fast, 4), "largest_difference_prompts": diff,
               "token_layers": engine.work.token_layers, "passes": engine.work.passes,
               "direct_token_layers": direct_tokens * model.n_layers, "gflop": round(need / 1e9, 4),
               "gflop_per_second": round(rate / 1e9, 4), "floor_seconds": round(floor, 5)}
    return [
        f"- **{name}**: {described}; {n} prompts in {len(prompts.groups)} groups (members {sizes}; prefix "
        f"{', '.join(map(str, prefixes))} tokens; own tokens {', '.join(map(str, own))} per prompt)",
        f"  - direct (one full forward per set, batch {args.batch_size}): {t_direct:.2f} s; batched END-only "
        f"passes: {t_fast:.2f} s; **speed-up {t_direct / t_fast:.1f}x** (target >= 4x); accuracies identical "
        f"at every point: **{'yes' if diff == 0 else f'no, largest difference {diff} prompts'}**",
        f"  - work: {engine.work.token_layers:,} token-layers in {engine.work.passes} passes, against "
        f"{direct_tokens * model.n_layers:,} for the direct method; {need / 1e9:.1f} GFLOP at the measured "
        f"{rate / 1e9:.1f} GFLOP/s: floor {floor:.3f} s; **batched / floor = {t_fast / floor:.2f}** "
        f"(target <= 1.5)",
    ], figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=12, help="largest k of the curves (the demo's)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16, help="the demo's batch size")
    ap.add_argument("--effects", help="effects.json of the demo's data for its ranking (default: path patching "
                    "on the data first)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true", help="print only, do not update RESULTS.md")
    ap.add_argument("--gpu", action="store_true", help="a random 7B-shaped model on a GPU (bench/analysis_gpu.py)")
    ap.add_argument("--prompts", type=int, default=256, help="with --gpu: how many prompts")
    ap.add_argument("--model", help="bundled name or model folder (default: smollm2-135m; with --tiny, a tiny "
                    "random Llama)")
    tiny.add_flags(ap)
    ap.set_defaults(pairs=None, keep_correct=True)  # the demo's own number of candidates, the pairs it gets right
    args = tiny.parse(ap, TINY)
    torch.set_num_threads(args.threads)
    if args.gpu:
        from bench import analysis_gpu

        text = "\n".join([provenance("bench/analysis.py --gpu", machine(analysis_gpu.DEVICE)),
                          *analysis_gpu.main(args)])
        print(text)
        if not args.no_write:
            write_section("Knockout curves at 7B scale on one GPU (bench/analysis.py --gpu)", text,
                          tiny.results_file(args))
        return
    cases = args.cases.split(",")
    if unknown := [c for c in cases if c not in CASES]:
        raise SystemExit(f"unknown case(s) {', '.join(unknown)}: choose from {', '.join(CASES)}")
    name = args.model or (str(tiny.model_folder()) if args.tiny else "smollm2-135m")
    model = load_model(name, device="cpu", dtype="float32")
    lines = [
        provenance("bench/analysis.py", machine(threads=args.threads)),
        f"- date: {datetime.date.today()}; command: `python -m bench.analysis --k {args.k} --seeds {args.seeds}"
        f"{' --effects ...' if args.effects else ''}{' --tiny' if args.tiny else ''}`",
        f"- model: {model.name} (fp32, CPU, {args.threads} threads, {platform.machine()}); "
        f"{1 + args.k + args.seeds * args.k} knockout sets per case: none, effect-rank k = 1..{args.k}, "
        f"{args.seeds} random orders k = 1..{args.k}",
    ]
    figures = {}
    for name in cases:
        case_lines, figures[name] = run_case(name, args, model)
        lines += case_lines
    print("\n".join(lines))
    if not args.no_write:
        publish("Knockout curves: direct vs batched END-only passes (bench/analysis.py)", "bench.analysis",
                "analysis", figures, lines, tiny.results_file(args))


if __name__ == "__main__":
    main()

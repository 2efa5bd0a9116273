"""Knockout curves on the demo's data: the direct method against the batched END-only passes.

Both run in one process on the same model, prompts, means and knockout sets. Prints both
times, their ratio and whether every accuracy is the same, and the batched passes' time
against their FLOP floor (the work they must do, at this machine's matrix-multiply rate).
Writes the figures into bench/RESULTS.md.

    python bench/analysis.py [--k 12] [--seeds 5] [--effects effects.json]
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
from results import matmul_rate, write_section  # noqa: E402

from keyheads.analysis.common import Batches, all_heads, load_samples  # noqa: E402
from keyheads.analysis.knockout_curves import CurveConfig, curve_sets, knockout_curves  # noqa: E402
from keyheads.analysis.passes import EndPasses  # noqa: E402
from keyheads.cli import main as cli  # noqa: E402
from keyheads.demo import demo_config  # noqa: E402
from keyheads.effects import Effects  # noqa: E402
from keyheads.knockout import compute_means  # noqa: E402
from keyheads.models import load_model  # noqa: E402
from keyheads.models.prompt_set import PromptSet  # noqa: E402


def demo_data(folder: Path) -> Path:
    """The pairs the demo makes (same templates, n, few-shot prefix, seed), and their effects."""
    cfg = demo_config({"model": "smollm2-135m", "out": str(folder), "device": "cpu", "dtype": "float32"})
    data = folder / "pairs.jsonl"
    args = ["data", "--task", cfg.data.task, "-n", str(cfg.data.n), "--few-shot", str(cfg.data.few_shot),
            "--keep-correct", "--single-token-answer", "--seed", str(cfg.seed), "--out", str(data)]
    args += ["--shared-prefix"] if cfg.data.shared_prefix else []
    if cfg.data.templates:
        args += ["--templates", ",".join(cfg.data.templates)]
    if cli(args):
        raise SystemExit("could not make the demo's pairs")
    return data


def flops(model, work) -> float:
    """FLOPs of the token-layers, attention pairs and END unembeddings the passes computed."""
    cfg = model.config
    d, q, kv = model.d_model, model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    per_token_layer = 2 * d * (q + 2 * kv) + 2 * q * d + 2 * 3 * d * cfg.intermediate_size
    return work.token_layers * per_token_layer + work.attention_pairs * 4 * q + work.end_rows * 2 * d * cfg.vocab_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=12, help="largest k of the curves (the demo's)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16, help="the demo's batch size")
    ap.add_argument("--effects", help="effects.json for the ranking (default: path patching on the data first)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true", help="print only, do not update RESULTS.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    folder = Path(tempfile.mkdtemp())
    data = demo_data(folder)
    effects_path = args.effects
    if effects_path is None:
        if cli(["patch", "--model", "smollm2-135m", "--data", str(data), "--first-token", "--top-k", "8",
                "--out", str(folder / "identify")]):
            raise SystemExit("path patching failed")
        effects_path = folder / "identify" / "effects.json"
    model = load_model("smollm2-135m", device="cpu", dtype="float32")
    samples = load_samples(model, data)
    refs, answers = [s.prompt for s in samples], [s.answer_id for s in samples]
    heads = all_heads(model)
    cfg = CurveConfig(k=args.k, seeds=args.seeds, seed=0)
    ranked = Effects.load(effects_path, model).ranked()
    rates = [matmul_rate(model.d_model, model.config.intermediate_size)]  # the best of three, around the timings
    with torch.inference_mode():
        full = compute_means(model, [s.counterfactual for s in samples], heads=heads, batch_size=args.batch_size,
                             progress=False)

        t = time.perf_counter()
        slow = knockout_curves(model, Batches(model, refs, args.batch_size), answers, full, ranked, heads, cfg,
                               progress=False)
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
    need = flops(model, engine.work)
    floor = need / rate
    direct_tokens = sum(len(model.tokens(p, add_special_tokens=True)) for p in refs) * len(points(fast))
    sizes = sorted(len(g.index) for g in prompts.groups)
    lines = [
        f"- date: {datetime.date.today()}; command: `python bench/analysis.py --k {args.k} --seeds {args.seeds}"
        f"{' --effects ...' if args.effects else ''}`",
        f"- model: smollm2-135m (fp32, CPU, {args.threads} threads, {platform.machine()}); the demo's data: {n} "
        f"addition prompts of {len(prompts.groups)} groups (members {sizes}), three-example prefix shared per template",
        f"- {len(points(fast))} knockout sets: none, effect-rank k = 1..{args.k}, "
        f"{args.seeds} random orders k = 1..{args.k}",
        f"- direct (one full forward per set, batch {args.batch_size}): {t_direct:.2f} s",
        f"- batched END-only passes: {t_fast:.2f} s",
        f"- **speed-up: {t_direct / t_fast:.1f}x** (target >= 4x); accuracies identical at every point: "
        f"**{'yes' if diff == 0 else f'no, largest difference {diff} prompts'}**",
        f"- work: {engine.work.token_layers:,} token-layers in {engine.work.passes} passes, against "
        f"{direct_tokens * model.n_layers:,} for the direct method",
        f"- FLOPs the batched passes must do: {need / 1e9:.1f} GFLOP; measured matmul rate {rate / 1e9:.1f} GFLOP/s; "
        f"floor {floor:.3f} s; **batched / floor = {t_fast / floor:.2f}** (target <= 1.5)",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("Knockout curves: direct vs batched END-only passes (bench/analysis.py)", text)


if __name__ == "__main__":
    main()

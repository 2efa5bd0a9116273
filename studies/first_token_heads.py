"""Key heads identified with first-token answers (the paper's data) against single-token answers only (the
data of the earlier studies): do the same heads come out, and as strongly?

With a tokenizer that splits digits, single-token answers keep only results below 10; with first-token
answers, '12' is scored by its first token and the pairs span the paper's whole range. Both data sets are
made with the data settings of configs/table1-smollm2.yaml (task all, n 120, 3-shot, shared prefix, kept
correct, seed 0) and differ only in `--single-token-answer`; path patching on each keeps the top 32 heads
(`--first-token` with the first-token data). The section compares the two effects.json files: the overlap
of the top 10 and the top 32, the Spearman rank correlation of all head effects, and the largest effect
(the most negative: effects.json stores the relative change of the answer logit, (patched - original) /
original, as a fraction, so -0.05 is the paper's -5%). Then each set's knockout curves (top-k by its own
effects against 5 random orders, k = 0..20, END-aligned means, no transfer) are drawn side by side.

    python studies/first_token_heads.py [--model smollm2-135m] [--threads 2] [--limit 300]
                                      [--out-root /root/kh-runs/first-token] [--no-knockout]

Each model has its own section. `--limit` is the knockout's seeded subset of each set's prompts
(keyheads' default, 300); the qwen2.5-coder-1.5b study's knockout stage used 120, and so does its run here.

Resumable: each step is skipped when its output exists (pairs.jsonl, patch/effects.json, then
knockout/knockout.json), in OUT_ROOT/MODEL/{single-token,first-token}/. Both sets' data and patching run
before either set's knockout curves.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "studies"))

from study_results import show_section  # noqa: E402

from keyheads.effects import Effects  # noqa: E402
from keyheads.results.knockout import KnockoutCurves, KnockoutResult  # noqa: E402
from keyheads.runfolder import read_result  # noqa: E402

# configs/table1-smollm2.yaml's data section (and configs/study-qwen1.5b.yaml's), less the answer filter,
# which is what this compares
DATA = ["--task", "all", "-n", "120", "--few-shot", "3", "--shared-prefix", "--keep-correct", "--seed", "0"]
TOP_K = 32
CURVE_K, CURVE_SEEDS, SHOWN_K = 20, 5, (2, 6, 10, 20)  # knockout curves: k = 0..20 against 5 random orders
LIMIT = 300  # knockout prompts per set, as `keyheads knockout --limit` defaults
FIGURE = ROOT / "studies" / "figures"
WAYS = {"single-token": (["--single-token-answer"], []),        # (data flags, patch flags)
        "first-token": (["--no-single-token-answer"], ["--first-token"])}


def title(model: str) -> str:
    """Each model's own section."""
    return f"Key heads with first-token answers against single-token answers: {model} (studies/first_token_heads.py)"


def commands(model: str, folder: Path, threads: int, limit: int = LIMIT) -> dict[str, list[list[str]]]:
    """way -> [the data command, the patch command], as run (with `keyheads` for the module)."""
    out = {}
    for way, (data_flags, patch_flags) in WAYS.items():
        where = folder / way
        out[way] = [
            ["keyheads", "data", "--model", model, *DATA, *data_flags, "--threads", str(threads), "--quiet",
             "--out", str(where / "pairs.jsonl")],
            ["keyheads", "patch", "--model", model, "--data", str(where / "pairs.jsonl"), "--top-k", str(TOP_K),
             *patch_flags, "--threads", str(threads), "--quiet", "--out", str(where / "patch")],
            ["keyheads", "knockout", "--model", model, "--data", str(where / "pairs.jsonl"), "--effects",
             str(where / "patch" / "effects.json"), "--top-k", "10", "--k", str(CURVE_K), "--seeds", str(CURVE_SEEDS),
             "--limit", str(limit), "--no-transfer", "--threads", str(threads), "--quiet",
             "--out", str(where / "knockout")]]
    return out


OUTPUTS = ("pairs.jsonl", "patch/effects.json", "knockout/knockout.json")  # what each step of a way writes


def _curves(path: Path) -> KnockoutCurves:
    """The curves of a knockout.json (read as its type)."""
    result = read_result(path, KnockoutResult.from_json)
    if result is None or result.curves is None:
        sys.exit(f"{path}: no knockout curves (run without --effects, or not written)")
    return result.curves


def curves_table(curves: dict[str, KnockoutCurves]) -> str:
    """Accuracy with the top-k heads (by each set's own effects) knocked out, and the random orders' mean ± std."""
    head = "| | k = 0 | " + " | ".join(f"k = {k}" for k in SHOWN_K) + " |"
    lines = [head, "|---|" + "---:|" * (1 + len(SHOWN_K))]
    for way, c in curves.items():
        ks = c.k
        top = [f"{100 * c.effect_rank[ks.index(k)]:.1f}%" if k in ks else "-" for k in SHOWN_K]
        rnd = [f"{100 * c.random_mean[ks.index(k)]:.1f} ± {100 * c.random_std[ks.index(k)]:.1f}%"
               if k in ks else "-" for k in SHOWN_K]
        lines.append(f"| {way}: top-k | {100 * c.effect_rank[0]:.1f}% | " + " | ".join(top) + " |")
        lines.append(f"| {way}: random-k | {100 * c.random_mean[0]:.1f}% | " + " | ".join(rnd) + " |")
    return "\n".join(lines)


def curves_summary(curves: dict[str, KnockoutCurves]) -> str:
    """Where each top-k curve lies against its random band, and the top 10's relative drop, in words."""
    parts = []
    for way, c in curves.items():
        below = [k for k, top, m, sd in zip(c.k, c.effect_rank, c.random_mean, c.random_std)
                 if k > 0 and top < m - sd]
        i10 = c.k.index(10)
        drop = c.effect_rank[i10] / c.effect_rank[0] - 1
        since = f"below the random band (mean - std) at every k from {below[0]}" if below and below == list(
            range(below[0], c.k[-1] + 1)) else f"below the random band at k = {', '.join(map(str, below))}"
        parts.append(f"With {way} answers the top-k curve lies {since}; the top 10 cost {100 * drop:+.1f}% "
                     f"relative, 10 random heads {100 * (c.random_mean[i10] / c.random_mean[0] - 1):+.1f}%.")
    return textwrap.fill(" ".join(parts), 110)


def draw_curves(curves: dict[str, KnockoutCurves], path: Path, model: str) -> None:
    """Both sets' curves side by side: top-k against the random orders' mean ± std."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.6), sharey=True)
    for ax, (way, c) in zip(axes, curves.items()):
        k = c.k
        mean, std = [100 * x for x in c.random_mean], [100 * x for x in c.random_std]
        ax.plot(k, [100 * x for x in c.effect_rank], "o-", color="tab:red", label="top-k by effect")
        ax.plot(k, mean, "s--", color="tab:blue", label=f"random-k (mean of {CURVE_SEEDS})")
        ax.fill_between(k, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                        color="tab:blue", alpha=0.15)
        ax.set_title(f"{model}: {way} answers")
        ax.set_xlabel("heads knocked out (k)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy of the answer token (%)")
    axes[0].legend(loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def same_pairs(a: list[dict], b: list[dict]) -> int:
    """How many pairs of `a` are in `b` too (same reference, counterfactual and answer)."""
    key = lambda r: (r["reference"], r["counterfactual"], str(r["answer"]))  # noqa: E731
    return len({key(r) for r in a} & {key(r) for r in b})


def summary(found: dict, shared: int, n_first: int, past: dict[str, int]) -> str:
    """What the comparison shows, in words chosen by the figures alone."""
    (_, e_s), (_, e_f) = found["largest"]
    k10, k32 = found["overlap"][10], found["overlap"][TOP_K]
    text = (f"{shared} of the {n_first} first-token pairs are also in the single-token set (answers below 10, "
            f"which both filters keep; with operands 1-9 that is all of subtraction and division). The top 10 "
            f"share {k10} heads and the top {TOP_K} share {k32} (rho {found['rho']:.2f}); "
            f"the largest effect is {100 * e_f:+.1f}% with first-token answers "
            f"against {100 * e_s:+.1f}% with single-token ones. ")
    if past["first-token"] == past["single-token"] == 0:
        text += ("With first-token answers no head passes the paper's -5% either, so on this model the weak "
                 "heads do not come from the single-token filter.")
    elif past["first-token"] > past["single-token"]:
        text += (f"With first-token answers {past['first-token']} heads pass the paper's -5%, against "
                 f"{past['single-token']} with single-token answers: the filter weakened the effects.")
    else:
        text += (f"Heads past the paper's -5%: {past['first-token']} with first-token answers, "
                 f"{past['single-token']} with single-token ones.")
    return textwrap.fill(text, 110)


def compare(a_path, b_path, ks=(10, 32)) -> dict:
    """Two effects.json files of the same model: the top heads of each (most negative first), their overlap
    at each k, the Spearman rank correlation of all head effects measured in both, the largest (most
    negative) effect of each."""
    from scipy.stats import spearmanr

    a, b = Effects.load(a_path), Effects.load(b_path)
    if len(a.heads) != len(b.heads) or any(len(x) != len(y) for x, y in zip(a.heads, b.heads)):
        raise SystemExit(f"{a_path} and {b_path} are not for the same layers x heads")
    ranked_a, ranked_b = a.ranked(), b.ranked()
    pairs = [(a.effect(h), b.effect(h)) for h in ranked_a if not (math.isnan(a.effect(h)) or math.isnan(b.effect(h)))]
    rho, p = spearmanr([x for x, _ in pairs], [y for _, y in pairs])
    return {
        "top": {k: ([tuple(h) for h in ranked_a[:k]], [tuple(h) for h in ranked_b[:k]]) for k in ks},
        "overlap": {k: len(set(ranked_a[:k]) & set(ranked_b[:k])) for k in ks},
        "rho": float(rho), "p": float(p), "n_heads": len(pairs),
        "largest": ((tuple(ranked_a[0]), a.effect(ranked_a[0])), (tuple(ranked_b[0]), b.effect(ranked_b[0]))),
        "n_samples": (a.n_samples, b.n_samples), "n_excluded": (a.n_excluded, b.n_excluded),
    }


def heads_text(heads, effects: Effects) -> str:
    return ", ".join(f"{l}.{h} ({100 * effects.effect((l, h)):+.1f}%)" for l, h in heads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=LIMIT, help="knockout prompts per set, a seeded subset")
    ap.add_argument("--out-root", default="/root/kh-runs/first-token")
    ap.add_argument("--no-knockout", action="store_true",
                    help="stop after both patchings; the section says that the knockout curves are still to run")
    args = ap.parse_args()
    folder = Path(args.out_root) / args.model
    keyheads = [sys.executable, "-m", "keyheads"]
    timings = folder / "seconds.json"  # each step's wall time, kept for a re-run that reads the steps back
    seconds = json.loads(timings.read_text()) if timings.exists() else {}
    run = commands(args.model, folder, args.threads, args.limit)
    # step by step across both sets (both data sets, both patchings, then both knockouts), so that the
    # identification comparison is complete before the long knockout curves start
    for step, out in enumerate(OUTPUTS[:2] if args.no_knockout else OUTPUTS):
        for way, way_cmds in run.items():
            (folder / way).mkdir(parents=True, exist_ok=True)
            cmd, done = way_cmds[step], folder / way / out
            if done.exists():
                print(f"{done} exists: skipping {cmd[1]} ({way})", flush=True)
                continue
            print("running:", shlex.join(cmd), flush=True)
            t0 = time.perf_counter()
            subprocess.run(keyheads + cmd[1:], check=True, cwd=ROOT)
            seconds[f"{way} {cmd[1]}"] = time.perf_counter() - t0
            timings.write_text(json.dumps(seconds, indent=1))

    single, first = (folder / w / "patch" / "effects.json" for w in WAYS)
    found = compare(single, first)
    eff = {w: Effects.load(folder / w / "patch" / "effects.json") for w in WAYS}
    rows = {w: read_rows(folder / w / "pairs.jsonl") for w in WAYS}
    counts = {w: collections.Counter(r["task"] for r in rows[w]) for w in WAYS}
    past = {w: sum(v < -0.05 for r in eff[w].heads for v in r) for w in WAYS}
    tasks = sorted(set(counts["single-token"]) | set(counts["first-token"]))
    table = ["| | " + " | ".join(tasks) + " | all | samples patched (excluded) |",
             "|---|" + "---:|" * (len(tasks) + 2)]
    for i, w in enumerate(WAYS):
        table.append(f"| {w} | " + " | ".join(str(counts[w][t]) for t in tasks) +
                     f" | {sum(counts[w].values())} | {found['n_samples'][i]} ({found['n_excluded'][i]}) |")
    (h_s, e_s), (h_f, e_f) = found["largest"]
    timing = ", ".join(f"{step} {s / 60:.1f} min" for step, s in seconds.items()) or "no step timed"
    cmds = "\n".join(f"    {shlex.join(c)}" for way_cmds in run.values() for c in way_cmds)
    if all((folder / w / OUTPUTS[2]).exists() for w in WAYS):
        curves = {w: _curves(folder / w / OUTPUTS[2]) for w in WAYS}
        figure = FIGURE / f"first-token-{args.model}-knockout.png"
        draw_curves(curves, figure, args.model)
        knockout = f"""\
Knockout curves on each set's own prompts (a seeded subset of up to {args.limit}), its own top heads by effect
against {CURVE_SEEDS} random orders (accuracy of the answer token; mean ablation with END-aligned means over the
set's counterfactual prompts):

{curves_table(curves)}

{curves_summary(curves)}

![knockout curves, single-token against first-token answers](figures/{figure.name})"""
    else:  # --no-knockout: the identification is complete, the curves are not
        knockout = textwrap.fill("Knockout curves: not run yet (the run stopped after both patchings). The command "
                                 "above runs them, resuming from the finished steps, and rewrites this section with "
                                 "them.", 110)
    k10, k32 = found["overlap"][10], found["overlap"][TOP_K]
    threads = f"{args.threads} thread" + ("s" if args.threads != 1 else "")
    body = f"""Measured {datetime.date.today().isoformat()} on {args.model}, fp32 on CPU, {threads}
(wall time of each step's last start, with any time it was paused for another job; a step run before its time
was kept has none: {timing}), with

    python studies/first_token_heads.py --model {args.model} --threads {args.threads} --limit {args.limit}

which runs (skipping a step whose output exists):

{cmds}

Data: configs/table1-smollm2.yaml's data settings, which the qwen2.5-coder-1.5b study shares (task all,
n 120 candidates per task, 3-shot, shared prefix, kept when the model's argmax is the answer's first token,
seed 0); the two sets differ only in the answer filter. Path patching: the exact path method, relative-logit
metric; effects.json stores each head's mean relative change of the answer logit as a fraction, negative when
patching the head lowers the logit, so the largest effect is the most negative (printed here in percent).

Pairs kept, per task:

{chr(10).join(table)}

Top 10 heads, most negative first (layer.head, effect):

- single-token answers: {heads_text(found['top'][10][0], eff['single-token'])}
- first-token answers: {heads_text(found['top'][10][1], eff['first-token'])}

| | single-token | first-token |
|---|---:|---:|
| largest effect (most negative) | {100 * e_s:+.1f}% ({h_s[0]}.{h_s[1]}) | {100 * e_f:+.1f}% ({h_f[0]}.{h_f[1]}) |
| heads past the paper's -5% | {past['single-token']} | {past['first-token']} |

- Overlap of the top 10: {k10} of 10; of the top {TOP_K}: {k32} of {TOP_K}.
- Spearman rank correlation of the {found['n_heads']} head effects: rho {found['rho']:.3f} (p {found['p']:.2g}).

{summary(found, same_pairs(rows['first-token'], rows['single-token']), len(rows['first-token']), past)}

{knockout}"""
    show_section(title(args.model), body)


if __name__ == "__main__":
    main()

"""The knockout stage's transfer control as a band: the key heads and several draws of as many random non-key
heads, knocked out on every transfer set.

The knockout stage (`keyheads knockout`, a run's knockout step) gives each transfer set one random control,
drawn with its `seed`. This script rebuilds the same sets with the same settings (`transfer_sets`: the seed
still picks the prompts) and draws the control again with seeds SEED, SEED+1, ... by the stage's own rule
(`control_heads`), so seed SEED re-measures the stage's column and the others give the band. Every knockout of
one set runs in one batched pass over that set's prompts.

    python studies/transfer_band.py --model qwen2.5-coder-1.5b --data PAIRS --heads 19.11,23.9,... \
        --limit 120 --transfer-n 40 --data-dir ../shared/data/benchmarks --seeds 3 [--transfer-data PAIRS2]
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import shlex
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "studies"))

from study_results import show_section  # noqa: E402

from keyheads.analysis.common import all_heads, read_pair_rows  # noqa: E402
from keyheads.analysis.knockout_run import cached_means, control_heads, transfer_sets  # noqa: E402
from keyheads.analysis.passes import EndPasses  # noqa: E402
from keyheads.analysis.settings import KnockoutSettings  # noqa: E402
from keyheads.components import Components  # noqa: E402
from keyheads.errors import BadFile, UserError  # noqa: E402
from keyheads.heads import Head  # noqa: E402
from keyheads.io import read_json, write_json  # noqa: E402
from keyheads.mean import DEFAULT_MEAN, MEAN_HELP, MEANS  # noqa: E402
from keyheads.models import load_model  # noqa: E402
from keyheads.models.prompt_set import PromptSet  # noqa: E402
from keyheads.report.stats import band  # noqa: E402
from keyheads.selection import Notes  # noqa: E402


def fill(text: str) -> str:
    return textwrap.fill(text, 115, break_long_words=False, break_on_hyphens=False)


def relative(after: float, before: float) -> float:
    return (after - before) / before if before else float("nan")


def measure(model, args) -> tuple[list[dict], list[list[Head]], Notes]:
    """Per transfer set: n, accuracy before, with the key heads out, and with each control draw out. The means
    and every finished set are kept in --work, so an interrupted run resumes after them."""
    settings = KnockoutSettings(seed=args.seed, limit=args.limit, mean=args.mean,
                                transfer_n=args.transfer_n, transfer_by=args.transfer_by)
    key = list(Components.explicit(args.heads).check(model.n_layers, model.n_heads).heads)
    notes = Notes()
    sets = transfer_sets(model, args.data, settings, args.transfer_data, args.data_dir, notes)
    draws = [control_heads(model, key, args.seed + i) for i in range(args.seeds)]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    cf = [r["counterfactual"] for r in read_pair_rows(args.data)]
    full = cached_means(model, cf, all_heads(model), args.mean, work / "means.safetensors", args.batch_size)
    # a finished set is reused only under the same model, sets, heads and draws
    stamp = hashlib.sha256(json.dumps([model.name, cf, args.mean, [[t.prompts, t.answer_ids] for t in sets],
                                       [str(h) for h in key], [[str(h) for h in d] for d in draws]]).encode())
    partial = work / "rows.partial.json"
    try:  # a checkpoint only saves time: one that cannot be read is started over, not an error
        saved = read_json(partial) if partial.exists() else {}
        rows = [{"set": str(r["set"]), "n": int(r["n"]), "before": float(r["before"]), "key": float(r["key"]),
                 "draws": [float(a) for a in r["draws"]]}
                for r in saved["rows"]][:len(sets)] if saved.get("stamp") == stamp.hexdigest() else []
    except (BadFile, AttributeError, KeyError, TypeError, ValueError):
        print(f"{partial} cannot be read: measuring every set again", file=sys.stderr)
        rows = []
    done = {"stamp": stamp.hexdigest(), "rows": rows}
    for tset in sets[len(rows):]:
        prompts = PromptSet(model, tset.prompts, args.batch_size)
        preds = EndPasses(model, prompts, full).predict([[], key, *draws], tset.answer_ids, progress=True)
        acc = [p.accuracy(tset.answer_ids) for p in preds]
        rows.append({"set": tset.name, "n": len(tset.prompts), "before": acc[0], "key": acc[1], "draws": acc[2:]})
        write_json(partial, done)
        print(f"{tset.name}: {acc}", flush=True)
    return rows, draws, notes


def table(rows: list[dict], seeds: int, first_seed: int = 0) -> str:
    head = ("| set | n | before | key heads out | "
            + " | ".join(f"random seed {first_seed + i}" for i in range(seeds))
            + f" | random: mean [range] ({seeds} draws) |")
    lines = [head, "|" + "---|" * (5 + seeds)]
    for r in rows:
        b = r["before"]
        rel = [relative(a, b) for a in r["draws"]]
        bd = band(rel)
        cells = [r["set"], str(r["n"]), f"{b:.1%}", f"{r['key']:.1%} ({relative(r['key'], b):+.1%})"]
        cells += [f"{a:.1%} ({x:+.1%})" for a, x in zip(r["draws"], rel)]
        cells.append(f"{bd.mean:+.1%} [{bd.low:+.1%}, {bd.high:+.1%}]")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="the identification pairs file (its counterfactuals give the means)")
    ap.add_argument("--heads", required=True, help="the key heads knocked out, as LAYER.HEAD,...")
    ap.add_argument("--transfer-data", default=None, help="another pairs file: one set per task (or template)")
    ap.add_argument("--transfer-by", default="task", choices=["task", "template"])
    ap.add_argument("--transfer-n", type=int, default=100, help="prompts per generated / benchmark set")
    ap.add_argument("--limit", type=int, default=300, help="identification prompts (seeded subset)")
    ap.add_argument("--mean", default=DEFAULT_MEAN, choices=MEANS, help=MEAN_HELP)
    ap.add_argument("--seed", type=int, default=0, help="the stage's seed: picks the prompts of every set")
    ap.add_argument("--seeds", type=int, default=3, help="control draws: seeds SEED..SEED+N-1")
    ap.add_argument("--data-dir", default=None, help="the benchmark folder (SVAMP, GSM8K rows)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--work", required=True, help="a folder for the means and the finished sets (resume)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--compare", default="", help="a paragraph set after the table (what the study recorded)")
    args = ap.parse_args()
    if args.seeds < 1:
        ap.error("--seeds must be at least 1")
    try:  # before the model loads: a typo costs nothing
        if not Components.explicit(args.heads).heads:
            ap.error("--heads names no head: give the key heads as LAYER.HEAD,...")
    except UserError as e:
        ap.error(f"--heads: {e}")
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)

    try:
        model = load_model(args.model, device="cpu", dtype="float32")
        rows, draws, notes = measure(model, args)
    except UserError as e:
        sys.exit(f"error: {e}")
    shown = list(sys.argv[1:])
    if "--compare" in shown:  # the paragraph is the section's text, not part of the measurement
        i = shown.index("--compare")
        del shown[i:i + 2]
    command = "python studies/transfer_band.py " + shlex.join(shown)
    drawn = "; ".join(f"seed {args.seed + i} {','.join(map(str, d))}" for i, d in enumerate(draws))
    intro = (f"Measured {datetime.date.today().isoformat()} on the CPU (fp32, {args.threads or 'torch default'} "
             "thread(s); no timing: a resumed call measures only what was left), added after the results. The "
             "knockout stage's transfer table has one random control, drawn with its seed; this re-measures that "
             f"table with the control drawn {args.seeds} times by the stage's rule (`control_heads`: the first "
             f"{len(draws[0])} of the non-key heads in the seed's random order), on the stage's own sets and prompts "
             f"(`transfer_sets`, seed {args.seed}). Seed {args.seed} is the stage's draw, so the key-heads column "
             f"and that seed's column re-measure the stage's table. Mean ablation with {args.mean} means over "
             f"the counterfactual prompts of `{args.data}`; each cell is top-1 accuracy of the first answer token, "
             "with its change relative to \"before\".")
    paragraphs = [fill(intro), fill(f"Key heads: {args.heads}. Control draws: {drawn}."), f"Command: `{command}`",
                  table(rows, args.seeds, args.seed)]
    if list(notes):
        paragraphs.append(fill("Notes: " + "; ".join(notes)))
    if args.compare:
        paragraphs.append(fill(args.compare))
    body = "\n\n".join(paragraphs) + "\n"
    title = f"Transfer control over {args.seeds} random draws: {args.model} (studies/transfer_band.py)"
    show_section(title, body)


if __name__ == "__main__":
    main()

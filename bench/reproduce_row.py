"""Reproduce one fine-tuned row of a run's table 1 from its adapter alone, item by item.

Runs `keyheads eval --adapter RUN/finetune/VARIANT --no-base` into an empty cache, with the run's
evaluation settings, then compares every per-item result (generation or choice scores) with the
one the run's own evaluation cached under the same key (the key hashes the adapter's weights, the
prompt and the settings, so equal keys mean the same question asked of the same weights).

    python bench/reproduce_row.py runs/study-qwen1.5b --variant precise@10 --limit 20 [--no-write]

generic-kl is left out by default: it compares against the base row, which --no-base skips.
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import write_section  # noqa: E402

from keyheads.evaluation.cache import ResultCache  # noqa: E402
from keyheads.runconfig import RunSettings  # noqa: E402
from keyheads.runfolder import FINETUNE_JSON, RunFolder  # noqa: E402

IGNORED = ("key", "variant")  # the row label may differ; the key is what is matched on


def latest_by_key(path: Path) -> dict[str, dict]:
    """key -> its latest row, as the evaluation reads it."""
    return ResultCache(path).rows if path.is_file() else {}


def compare(fresh: dict[str, dict], run: dict[str, dict]) -> dict:
    """How many fresh rows the run has under the same key, and how many of those are identical."""
    same = [k for k in fresh if k in run]
    differ = [k for k in same if {f: v for f, v in fresh[k].items() if f not in IGNORED}
              != {f: v for f, v in run[k].items() if f not in IGNORED}]
    return {"items": len(fresh), "in_run": len(same), "identical": len(same) - len(differ),
            "differ": [fresh[k].get("id") for k in differ]}


def accuracy(out: Path, bench: str) -> float | None:
    found = list(out.glob(f"*/{bench}.json"))
    return json.loads(found[0].read_text()).get("accuracy") if found else None


def eval_command(run: Path, cfg: RunSettings, variant: str, benches: list[str], limit: int, cache: Path,
                 out: Path, threads: int | None) -> list[str]:
    cmd = ["keyheads", "eval", "--adapter", str(RunFolder(run).finetune(variant)), "--no-base",
           "--benchmarks", ",".join(benches), "--limit", str(limit), "--cache-dir", str(cache),
           "--out", str(out), "--split", cfg.resolved_eval_split()]
    for flag, value in (("--data-dir", cfg.data_dir), ("--dtype", cfg.dtype), ("--device", cfg.device),
                        ("--batch-size", cfg.batch_size), ("--few-shot", cfg.eval.few_shot),
                        ("--seed", cfg.seed), ("--threads", threads)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a `keyheads run` folder whose eval stage has evaluated VARIANT")
    ap.add_argument("--variant", required=True, help="a folder under RUN/finetune, e.g. precise@10")
    ap.add_argument("--benchmarks", help="comma-separated (default: the run's, without generic-kl)")
    ap.add_argument("--limit", type=int, help="first N items of each (default: the run's eval.limit)")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()

    run = Path(args.run)
    folder = RunFolder(run)
    if args.variant not in folder.finetune_records:
        sys.exit(f"{folder.finetune(args.variant)} holds no finished adapter ({FINETUNE_JSON})")
    cfg = RunSettings.model_validate(folder.config_record)
    benches = args.benchmarks.split(",") if args.benchmarks else [b for b in cfg.eval.benchmarks if b != "generic-kl"]
    limit = args.limit or cfg.eval.limit
    with tempfile.TemporaryDirectory(prefix="reproduce-") as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "out"
        cmd = eval_command(run, cfg, args.variant, benches, limit, cache, out, args.threads)
        print("$", shlex.join(cmd), flush=True)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "keyheads", *cmd[1:]], check=True)
        seconds = time.perf_counter() - started
        found = {b: compare(latest_by_key(cache / f"{b}.sqlite"), latest_by_key(folder.eval_cache / f"{b}.sqlite"))
                 for b in benches}
        acc = {b: accuracy(out, b) for b in benches}

    lines = ["| benchmark | items | under the same key in the run | identical | accuracy from the adapter |",
             "|---|---|---|---|---|"]
    for b, c in found.items():
        a = "-" if acc[b] is None else f"{100 * acc[b]:.1f}%"
        lines.append(f"| {b} | {c['items']} | {c['in_run']} | {c['identical']} | {a} |")
    total = sum(c["identical"] for c in found.values())
    items = sum(c["items"] for c in found.values())
    differ = {b: c["differ"] for b, c in found.items() if c["differ"]}
    shown = shlex.join(cmd).replace(tmp, "EMPTY_DIR")  # the temporary folder's name means nothing later
    again = f"python bench/reproduce_row.py {args.run} --variant {args.variant} --limit {limit}" + (
        f" --benchmarks {args.benchmarks}" if args.benchmarks else "")
    body = "\n".join([
        f"- date: {datetime.date.today()}; `{shown}` ({seconds:.0f} s), compared by `{again}`",
        "",
        *lines,
        "",
        f"**{total} of {items}** per-item results are identical to the run's own evaluation"
        + (f"; differing items: {differ}" if differ else "") + ".",
    ])
    print(body)
    if not args.no_write:
        write_section(f"Reproducing a row from its adapter: {cfg.model} {args.variant} ({run.name})", body)


if __name__ == "__main__":
    main()

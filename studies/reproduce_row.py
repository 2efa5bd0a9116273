"""Reproduce one fine-tuned row of a run's table 1 from its adapter alone, item by item.

Runs `keyheads eval --adapter RUN/finetune/VARIANT --no-base` into an empty cache, with the run's
evaluation settings, then compares every per-item result (generation or choice scores) with the
one the run's own evaluation cached under the same key (the key hashes the adapter's weights, the
prompt and the settings, so equal keys mean the same question asked of the same weights).

    python -m studies.reproduce_row runs/study-qwen1.5b --variant precise@10 --limit 20
    python -m studies.reproduce_row --adapter RUN/full --eval RUN/eval/full   # a `keyheads eval --adapter` folder

generic-kl is left out by default: it compares against the base row, which --no-base skips.
"""
from __future__ import annotations

import argparse
import datetime
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from keyheads.config.run import RunSettings
from keyheads.evaluation.cache import ResultCache
from keyheads.results.evaluation import BenchmarkSummary, EvalResults
from keyheads.results.finetune import FinetuneResult
from keyheads.runfolder import FINETUNE_JSON, RESULTS_JSON, RunFolder, read_result
from studies.study_results import show_section

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
    found = [read_result(path, BenchmarkSummary.from_json) for path in out.glob(f"*/{bench}.json")]
    return found[0].accuracy if found and found[0] is not None else None


def eval_command(adapter: Path, settings: dict, benches: list[str], limit: int, cache: Path, out: Path,
                 threads: int | None) -> list[str]:
    """`keyheads eval` of the adapter alone with `settings` (the evaluation's: split, data, batch, seed...)."""
    cmd = ["keyheads", "eval", "--adapter", str(adapter), "--no-base", "--benchmarks", ",".join(benches),
           "--limit", str(limit), "--cache-dir", str(cache), "--out", str(out)]
    for flag, value in (("--split", settings.get("split")), ("--data-dir", settings.get("data_dir")),
                        ("--dtype", settings.get("dtype")), ("--device", settings.get("device")),
                        ("--batch-size", settings.get("batch_size")), ("--few-shot", settings.get("few_shot")),
                        ("--seed", settings.get("seed")), ("--threads", threads)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


def from_run(run: Path, variant: str) -> tuple[Path, dict, list[str], int | None, Path, str]:
    """A run's variant: (adapter, eval settings, benchmarks, limit, the run's eval cache, the section's title)."""
    folder = RunFolder(run)
    if variant not in folder.finetune_records:
        sys.exit(f"{folder.finetune(variant)} holds no finished adapter ({FINETUNE_JSON})")
    saved = folder.config_record
    cfg = RunSettings.model_validate(saved.to_json() if saved is not None else {})
    settings = {"split": cfg.eval.split, "data_dir": cfg.data_dir, "dtype": cfg.dtype, "device": cfg.device,
                "batch_size": cfg.batch_size, "few_shot": cfg.eval.few_shot, "seed": cfg.seed}
    return (folder.finetune(variant), settings, cfg.eval.benchmarks, cfg.eval.limit, folder.eval_cache,
            f"{cfg.model} {variant} ({run.name})")


def from_eval(adapter: Path, eval_dir: Path) -> tuple[Path, dict, list[str], int | None, Path, str]:
    """An adapter evaluated by `keyheads eval --adapter` into eval_dir: the same, from its results.json."""
    table = read_result(eval_dir / RESULTS_JSON, EvalResults.from_json)
    record = read_result(adapter / FINETUNE_JSON, FinetuneResult.from_json)
    if table is None or record is None:
        sys.exit(f"{eval_dir / RESULTS_JSON} and {adapter / FINETUNE_JSON} are needed: the folders of a finished "
                 "`keyheads finetune` and `keyheads eval --adapter`")
    settings = table.config.to_json()  # the EvalSettings as saved, every key
    return (adapter, settings, table.benchmarks, settings["limit"], Path(settings["cache_dir"]),
            f"{record.base_model} {adapter.name} ({eval_dir})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", help="a `keyheads run` folder whose eval stage has evaluated VARIANT")
    ap.add_argument("--variant", help="a folder under RUN/finetune, e.g. precise@10")
    ap.add_argument("--adapter", type=Path, help="instead of RUN: a `keyheads finetune` folder ...")
    ap.add_argument("--eval", type=Path, help="... and the `keyheads eval --adapter` folder that evaluated it")
    ap.add_argument("--benchmarks", help="comma-separated (default: the evaluation's, without generic-kl)")
    ap.add_argument("--limit", type=int, help="first N items of each (default: the evaluation's limit)")
    ap.add_argument("--threads", type=int)
    args = ap.parse_args()
    if (args.run is None) == (args.adapter is None) or bool(args.variant) != bool(args.run) \
            or bool(args.adapter) != bool(args.eval):
        ap.error("give RUN --variant VARIANT, or --adapter DIR --eval DIR")

    adapter, settings, evaluated, run_limit, run_cache, title = (
        from_run(Path(args.run), args.variant) if args.run else from_eval(args.adapter, args.eval))
    benches = args.benchmarks.split(",") if args.benchmarks else [b for b in evaluated if b != "generic-kl"]
    limit = args.limit or run_limit
    with tempfile.TemporaryDirectory(prefix="reproduce-") as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "out"
        cmd = eval_command(adapter, settings, benches, limit, cache, out, args.threads)
        print("$", shlex.join(cmd), flush=True)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "keyheads", *cmd[1:]], check=True)
        seconds = time.perf_counter() - started
        found = {b: compare(latest_by_key(cache / f"{b}.sqlite"), latest_by_key(run_cache / f"{b}.sqlite"))
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
    source = f"{args.run} --variant {args.variant}" if args.run else f"--adapter {args.adapter} --eval {args.eval}"
    again = f"python -m studies.reproduce_row {source} --limit {limit}" + (
        f" --benchmarks {args.benchmarks}" if args.benchmarks else "")
    body = "\n".join([
        f"- date: {datetime.date.today()}; `{shown}` ({seconds:.0f} s), compared by `{again}`",
        "",
        *lines,
        "",
        f"**{total} of {items}** per-item results are identical to the run's own evaluation"
        + (f"; differing items: {differ}" if differ else "") + ".",
    ])
    show_section(f"Reproducing a row from its adapter: {title}", body)


if __name__ == "__main__":
    main()

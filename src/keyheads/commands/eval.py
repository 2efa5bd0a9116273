"""`keyheads eval`: the paper's table 1 for a model, and for the model with heads knocked out."""
from __future__ import annotations

import time
from pathlib import Path

from ..config.commands import EvalCommand, check_shard
from ..errors import SettingError
from ..heads import read_heads
from ..models import DEFAULT_MODEL
from .flags import add_settings, settings
from .models import load_from_args, resident_only


def _list(text: str | None) -> list[str]:
    return [s.strip() for s in (text or "").split(",") if s.strip()]


def variants_from_args(cfg: EvalCommand):
    from ..evaluation import Variant

    variants = []
    model = cfg.model or DEFAULT_MODEL
    if cfg.baseline:
        variants.append(Variant.make("model", cfg.baseline))
    knockout = bool(cfg.knockout or cfg.knockout_mlps)
    if not ((knockout or cfg.adapter) and not cfg.base):
        variants.append(Variant.make("model", _adapter_base(cfg.adapter[0]) if cfg.adapter and cfg.model is None
                                     else model))
    if knockout:
        heads = read_heads(cfg.knockout) if cfg.knockout else []
        mlps = [int(m) for m in _list(cfg.knockout_mlps)]
        if not cfg.knockout_data:
            raise SettingError("--knockout/--knockout-mlps need --knockout-data PAIRS.jsonl: the means are taken "
                               "over its counterfactual prompts")
        what = ", ".join([f"{len(heads)} heads"] * bool(heads) + [f"MLPs {','.join(map(str, mlps))}"] * bool(mlps)
                         + ["global mean"] * (cfg.mean == "global"))  # the aligned mean is the knockout
        variants.append(Variant.make("knockout", model, label=f"{model} - knockout ({what})",
                                     heads=[h.to_json() for h in heads], mlps=mlps, data=str(cfg.knockout_data),
                                     mean=cfg.mean))
    for folder in cfg.adapter:
        variants.append(Variant.make("adapter", str(folder)))
    for spec in cfg.variant:  # any registered kind, without a dedicated option
        try:
            variants.append(Variant.make(spec["kind"], spec["model"], spec.get("label", ""), **spec.get("options", {})))
        except (KeyError, TypeError) as err:
            raise SettingError(f"--variant needs JSON like {{\"kind\": \"model\", \"model\": \"path\", "
                               f"\"label\": \"...\", \"options\": {{}}}}, got {spec!r} ({err})") from err
    return variants


def _adapter_base(folder: str) -> str:
    """The base model a fine-tuning run folder was trained from: the reference row of its table."""
    from ..finetune.adapter import read_info

    return read_info(folder)["base_model"]


def cmd_eval(args) -> int:
    cfg: EvalCommand = settings(args)  # every setting, file and folder is checked before any model loads
    from .. import distributed
    from ..evaluation import evaluate

    shard = check_shard(cfg.shard)
    variants = variants_from_args(cfg)
    if any(v.kind == "adapter" for v in variants):  # fine-tuned weights are written into a copy of the base
        resident_only(cfg, "eval --adapter")
    start = time.time()
    results = evaluate(variants, cfg.eval_config(), cfg.out, loader=lambda name: load_from_args(cfg, name),
                       data_dir=cfg.data_dir, batch_size=cfg.batch_size, cache_dir=cfg.cache_dir,
                       progress=not cfg.quiet and distributed.is_main(), shard=shard)
    if shard is not None:
        done = sum(b.timing["computed"] for r in results for b in r.benchmarks.values() if b.timing)
        print(f"shard {cfg.shard}: computed {done} items in {time.time() - start:.0f} s; when every shard has "
              "finished, run the same command without --shard to write the table (all from the cache)")
        return 0
    if not distributed.is_main():  # one of several processes: the main one writes and prints the table
        return 0
    print((Path(cfg.out) / "table.md").read_text(), end="")
    print(f"written to {cfg.out}/ (table.md, table.csv, results.json, per-variant wrong cases) "
          f"in {time.time() - start:.0f} s")
    return 0


def register(sub) -> None:
    p = sub.add_parser("eval", help="table 1: math (GSM8K, AddSub, SingleEq, SVAMP) and generic (MMLU, CSQA) accuracy; "
                       "held-out generated arithmetic (arith-*)")
    add_settings(p, EvalCommand)
    p.set_defaults(func=cmd_eval)

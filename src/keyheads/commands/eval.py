"""`keyheads eval`: the paper's table 1 for a model, and for the model with heads knocked out."""
from __future__ import annotations

import json
import time
from pathlib import Path

from .. import distributed
from .models import add_model_args


def _list(text: str | None) -> list[str]:
    return [s.strip() for s in (text or "").split(",") if s.strip()]


def variants_from_args(args):
    from ..evaluation import Variant
    from ..heads import read_heads

    variants = []
    if args.baseline:
        variants.append(Variant.make("model", args.baseline))
    knockout = bool(args.knockout or args.knockout_mlps)
    adapters = args.adapter or []
    if not ((knockout or adapters) and args.no_base):
        variants.append(Variant.make("model", _adapter_base(adapters[0]) if adapters and not getattr(args, "model_given", True)
                                     else args.model))
    if knockout:
        heads = read_heads(args.knockout) if args.knockout else []
        mlps = [int(m) for m in _list(args.knockout_mlps)]
        if not args.knockout_data:
            raise ValueError("--knockout/--knockout-mlps need --knockout-data PAIRS.jsonl: the means are taken "
                             "over its counterfactual prompts")
        what = ", ".join([f"{len(heads)} heads"] * bool(heads) + [f"MLPs {','.join(map(str, mlps))}"] * bool(mlps))
        variants.append(Variant.make("knockout", args.model, label=f"{args.model} - knockout ({what})",
                                     heads=[h.to_json() for h in heads], mlps=mlps, data=str(args.knockout_data)))
    for folder in adapters:
        variants.append(Variant.make("adapter", str(folder)))
    for spec in args.variant or []:  # any registered kind, without a dedicated option
        try:
            spec = json.loads(spec)
            variants.append(Variant.make(spec["kind"], spec["model"], spec.get("label", ""), **spec.get("options", {})))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"--variant needs JSON like {{\"kind\": \"model\", \"model\": \"path\", "
                             f"\"label\": \"...\", \"options\": {{}}}}, got {spec!r} ({err})") from err
    return variants


def _adapter_base(folder: str) -> str:
    """The base model a fine-tuning run folder was trained from: the reference row of its table."""
    from ..finetune.adapter import read_info

    return read_info(folder)["base_model"]


def _shard(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: expected K/N, e.g. 0/4 for the first of four processes") from None
    return k, n


def _check(args) -> None:
    """Counts, files and folders, before any model loads."""
    from ..settings import SettingError, apply_common, check_int, check_writable_dir

    apply_common(args)
    for flag, least in (("limit", 1), ("batch_size", 1), ("max_new_tokens", 1), ("few_shot", 0), ("heldout_seed", 0)):
        if getattr(args, flag) is not None:
            check_int("--" + flag.replace("_", "-"), getattr(args, flag), least)
    if not 0 <= args.heldout_fraction < 1:
        raise SettingError("--heldout-fraction", args.heldout_fraction, "must be >= 0 and < 1")
    if args.knockout_data is not None and not Path(args.knockout_data).is_file():
        raise FileNotFoundError(f"--knockout-data {args.knockout_data}: no such file")
    check_writable_dir(args.out, "--out")
    if args.cache_dir is not None:
        check_writable_dir(args.cache_dir, "--cache-dir")


def cmd_eval(args) -> int:
    from ..models import DEFAULT_MODEL

    _check(args)
    args.model_given = args.model is not None
    args.model = args.model or DEFAULT_MODEL
    from ..data.trainset import SplitConfig
    from ..evaluation import EvalConfig, evaluate
    from ..evaluation.tasks import check_benchmarks
    from ..models import load_model

    device = args.device or distributed.default_device()  # under a launcher: this process's own GPU
    cfg = EvalConfig(benchmarks=check_benchmarks(_list(args.benchmarks)), data_dir=args.data_dir, limit=args.limit,
                     batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, few_shot=args.few_shot,
                     cot=not args.no_cot, seed=args.seed, split=args.split,
                     heldout=SplitConfig(args.heldout_seed, args.heldout_fraction), cache_dir=args.cache_dir,
                     progress=not args.quiet and distributed.is_main(), shard=_shard(args.shard))
    variants = variants_from_args(args)
    start = time.time()
    results = evaluate(variants, cfg, args.out,
                       loader=lambda name: load_model(name, device=device, dtype=args.dtype))
    if cfg.shard is not None:
        done = sum(b["timing"]["computed"] for r in results for b in r["benchmarks"].values())
        print(f"shard {args.shard}: computed {done} items in {time.time() - start:.0f} s; when every shard has "
              "finished, run the same command without --shard to write the table (all from the cache)")
        return 0
    if not distributed.is_main():  # one of several processes: the main one writes and prints the table
        return 0
    print((Path(args.out) / "table.md").read_text(), end="")
    print(f"written to {args.out}/ (table.md, table.csv, results.json, per-variant wrong cases) "
          f"in {time.time() - start:.0f} s")
    return 0


def register(sub) -> None:
    from ..evaluation.tasks import ARITH, BENCHMARKS, TABLE_BENCHMARKS

    p = sub.add_parser("eval", help="table 1: math (GSM8K, AddSub, SingleEq, SVAMP) and generic (MMLU, CSQA) accuracy; "
                       "held-out generated arithmetic (arith-*)")
    add_model_args(p, seed_help="picks the few-shot exemplars")
    p.set_defaults(model=None)  # with --adapter, the adapter's base model
    p.add_argument("--knockout", metavar="HEADS", help="heads to mean-ablate: '12.3,14.2' or a JSON/CSV key-head list")
    p.add_argument("--knockout-mlps", metavar="LAYERS", help="MLP layers to mean-ablate, e.g. '14,15'")
    p.add_argument("--knockout-data", metavar="F.jsonl",
                   help="pairs file (reference, counterfactual, answer per line) whose counterfactual prompts give the means")
    p.add_argument("--adapter", action="append", metavar="DIR",
                   help="a `keyheads finetune` run folder (precise, LoRA or full) as one more row, with its train "
                   "speed and tuned parameters; repeatable. Its base model is the first row unless --model is given")
    p.add_argument("--no-base", action="store_true", help="with --knockout or --adapter: skip the unmodified model's row")
    p.add_argument("--baseline", metavar="MODEL", help="another model evaluated first, as the reference row for Δ "
                   "(for example the base of a fine-tuned folder)")
    p.add_argument("--variant", action="append", metavar="JSON",
                   help='one more row of any registered kind: {"kind": ..., "model": ..., "label": ..., "options": {...}} '
                   "(repeatable)")
    p.add_argument("--benchmarks", default=",".join(TABLE_BENCHMARKS),
                   help=f"comma-separated, from {','.join(BENCHMARKS)} (default: the table's six). The "
                   f"{','.join(ARITH)} sets are generated (no data folder) and held out from --train arith:...")
    p.add_argument("--limit", type=int, help="only the first N items per benchmark (quick runs)")
    p.add_argument("--data-dir", help="benchmarks folder (default: $KEYHEADS_DATA; else the hub when online)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per forward pass (default: 16)")
    p.add_argument("--max-new-tokens", type=int,
                   help="generation budget for the math sets (default: 256 for GSM8K, 128 for the others, "
                   "8 for arith-*)")
    p.add_argument("--few-shot", type=int, help="exemplars per prompt (default: 4 for math and arith, 5 for "
                   "MMLU/CSQA; MMLU has at most 5)")
    p.add_argument("--no-cot", action="store_true", help="math exemplars without the worked solution")
    p.add_argument("--split", choices=("full", "heldout"), default="full",
                   help="heldout: AddSub/SingleEq/SVAMP minus the part used for fine-tuning (see keyheads.data.trainset)")
    p.add_argument("--heldout-seed", type=int, default=0, help="seed of the held-out split (default: 0)")
    p.add_argument("--heldout-fraction", type=float, default=0.3, help="training share of the held-out split")
    p.add_argument("--shard", metavar="K/N", help="compute only shard K of N (0-based) of every benchmark, so that "
                   "N processes or GPUs sharing --cache-dir split the work; then run without --shard for the table. "
                   "Under accelerate launch or torchrun the processes shard by themselves and the main one writes it")
    p.add_argument("--out", required=True, help="run folder: table.md, table.csv, results.json, wrong cases")
    p.add_argument("--cache-dir", help="per-item result cache, shared by runs so that a re-run or an interrupted "
                   "run resumes (default: $KEYHEADS_CACHE/eval)")
    p.set_defaults(func=cmd_eval)

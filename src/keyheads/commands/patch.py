"""`keyheads patch`: per-head and per-MLP effects on the answer logit, into a run folder."""
from __future__ import annotations

from pathlib import Path

from .. import distributed
from .models import DefaultsFormatter, add_model_args, load_from_args


def cmd_patch(args) -> int:
    from ..patching import PatchConfig
    from ..patching.identify import describe, identify
    from ..patching.metrics import check_metric
    from ..patching.run import check_method, clear_checkpoints
    from ..settings import apply_common, check_int, check_writable_dir

    apply_common(args)  # before loading a model: a typo should fail at once
    check_method(args.method)
    check_metric(args.metric)
    check_int("--batch-size", args.batch_size, 1)
    for flag, value in (("--limit", args.limit), ("--top-k", args.top_k)):
        if value is not None:
            check_int(flag, value, 1)
    if not Path(args.data).is_file():
        raise FileNotFoundError(f"--data {args.data}: no such file (make one with `keyheads data`)")
    out = check_writable_dir(args.out, "--out")
    if args.restart:
        clear_checkpoints(out)
    model = load_from_args(args)
    config = PatchConfig(method=args.method, metric=args.metric, batch_size=args.batch_size, limit=args.limit,
                         min_abs_logit=args.min_abs_logit, first_token=args.first_token)
    effects, keys = identify(model, args.data, config, out, threshold=args.threshold, top_k=args.top_k,
                             progress=not args.quiet)
    if not distributed.is_main():
        return 0
    print(describe(effects, keys))
    print(f"wrote {out}/effects.json, effects.csv, key_heads.json, heatmap.png")
    return 0


def register(sub) -> None:
    from ..patching import METHODS, METRICS

    p = sub.add_parser("patch", help="path/activation/attribution patching of every head and MLP",
                       formatter_class=DefaultsFormatter)
    add_model_args(p, seed_help="patching is deterministic, so the seed changes nothing")
    p.add_argument("--data", required=True, help="pairs JSONL (reference, counterfactual, answer)")
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument("--method", default="path", help=f"one of {', '.join(METHODS)}")
    p.add_argument("--metric", default="relative-logit", help=f"one of {', '.join(METRICS)}")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--limit", type=int, default=None, help="use the first N pairs")
    p.add_argument("--threshold", type=float, default=None,
                   help="key heads: effect below this (default -0.05, the paper's, unless --top-k is given)")
    p.add_argument("--top-k", type=int, default=None, help="key heads: the K most negative (below --threshold if given)")
    p.add_argument("--min-abs-logit", type=float, default=1e-2,
                   help="relative-logit: exclude samples whose answer logit is closer to zero")
    p.add_argument("--first-token", action="store_true", help="accept multi-token answers, measure the first")
    p.add_argument("--restart", action="store_true", help="discard a checkpoint in --out and start over")
    p.set_defaults(func=cmd_patch)

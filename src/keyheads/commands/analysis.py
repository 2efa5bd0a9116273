"""`keyheads knockout`, `keyheads attention` and `keyheads mlp`: validate and explain the key components."""
from __future__ import annotations

from pathlib import Path

from .models import DefaultsFormatter, add_model_args, load_from_args


def _limit(value: int) -> int | None:
    return None if value <= 0 else value


def _selection(args):
    from ..analysis.run import Selection
    from ..heads import parse_heads

    return Selection(heads=tuple(parse_heads(args.heads or "")), effects=args.effects, threshold=args.threshold,
                     top_k=args.top_k)


def _check(args) -> None:
    """What the three commands can say is wrong before a model loads."""
    from ..settings import apply_common, check_int, check_writable_dir

    apply_common(args)
    check_int("--n-samples", args.n_samples, 0)
    check_int("--batch-size", args.batch_size, 1)
    if getattr(args, "top_k", None) is not None:
        check_int("--top-k", args.top_k, 1)
    for flag in ("data", "effects", "transfer_data"):
        path = getattr(args, flag, None)
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"--{flag.replace('_', '-')} {path}: no such file")
    check_writable_dir(args.out, "--out")


def _user_errors(fn):
    """Analysis input errors become the CLI's plain error messages."""
    def wrapped(args):
        from ..analysis.common import AnalysisError
        from ..errors import UserError

        try:
            return fn(args)
        except AnalysisError as err:
            raise UserError(str(err)) from err
    return wrapped


@_user_errors
def cmd_knockout(args) -> int:
    from ..analysis.run import KnockoutRun, run_knockout
    from ..settings import check_int

    _check(args)
    check_int("--k", args.k, 1)
    check_int("--seeds", args.seeds, 1)
    check_int("--transfer-n", args.transfer_n, 0)
    cfg = KnockoutRun(data=args.data, out=args.out, selection=_selection(args), k=args.k, seeds=args.seeds,
                      seed=args.seed, n_samples=_limit(args.n_samples), batch_size=args.batch_size,
                      mean_mode=args.mean_mode, transfer=not args.no_transfer, transfer_data=args.transfer_data,
                      transfer_by=args.transfer_by, data_dir=args.data_dir, transfer_n=_limit(args.transfer_n),
                      transfer_control=not args.no_control, progress=not args.quiet)
    run_knockout(load_from_args(args), cfg)
    return 0


@_user_errors
def cmd_attention(args) -> int:
    from ..analysis.run import AttentionRun, run_attention

    _check(args)
    cfg = AttentionRun(data=args.data, out=args.out, selection=_selection(args), n_samples=_limit(args.n_samples),
                       seed=args.seed, batch_size=args.batch_size, progress=not args.quiet)
    run_attention(load_from_args(args), cfg)
    return 0


@_user_errors
def cmd_mlp(args) -> int:
    from ..analysis.run import MLPRun, run_mlp

    _check(args)
    cfg = MLPRun(data=args.data, out=args.out, n_samples=_limit(args.n_samples), seed=args.seed,
                 batch_size=args.batch_size, case=args.case, case_answer=args.case_answer, progress=not args.quiet)
    run_mlp(load_from_args(args), cfg)
    return 0


def _common(p, samples: int, seed_help: str = "picks the --n-samples subset of the prompts") -> None:
    add_model_args(p, seed_help=seed_help)
    p.add_argument("--data", required=True, help="pairs JSONL (reference, counterfactual, answer[, positions, operands])")
    p.add_argument("--out", required=True, help="run folder for JSON, CSV and PNG files")
    p.add_argument("--n-samples", type=int, default=samples, help="reference prompts used, a seeded subset (0 = all)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per forward pass")


def _heads(p) -> None:
    p.add_argument("--effects", help="effects.json from `keyheads patch` (heads ranked most negative first)")
    p.add_argument("--heads", help="explicit key heads, e.g. 12.3,14.2 (instead of selecting from --effects)")
    p.add_argument("--threshold", type=float, default=None,
                   help="key heads: effect below this (default -0.05 unless --top-k is given)")
    p.add_argument("--top-k", type=int, default=None,
                   help="key heads: the K most negative (among those below --threshold if that is given too)")


def register(sub) -> None:
    fmt = DefaultsFormatter
    p = sub.add_parser("knockout", formatter_class=fmt,
                       help="mean-ablation knockout: effect-rank vs random-rank curves, key heads, transfer")
    _common(p, samples=300, seed_help="picks the --n-samples subset, the random-rank orderings, the control "
                                      "heads and the transfer sets' prompts")
    _heads(p)
    p.add_argument("--k", type=int, default=20, help="curves knock out k = 0..K heads (capped at the head count)")
    p.add_argument("--seeds", type=int, default=5, help="random-rank orderings")
    p.add_argument("--mean-mode", default="aligned", choices=["aligned", "global"],
                   help="means per END-aligned position, or one mean over all positions")
    p.add_argument("--transfer-data", help="another pairs file (other templates / tasks) for the transfer table")
    p.add_argument("--transfer-by", default="task", choices=["task", "template"],
                   help="one transfer row per task or per template of --transfer-data")
    p.add_argument("--data-dir", help="benchmark folder with svamp/SVAMP.json and gsm8k/test.jsonl "
                                      "(default $KEYHEADS_DATA)")
    p.add_argument("--transfer-n", type=int, default=100, help="prompts per transfer set (0 = all)")
    p.add_argument("--no-transfer", action="store_true", help="skip the transfer table")
    p.add_argument("--no-control", action="store_true",
                   help="transfer without the control knockout of as many random non-key heads")
    p.set_defaults(func=cmd_knockout, batch_size=32)

    p = sub.add_parser("attention", formatter_class=fmt,
                       help="END-token attention of the key heads by token role, heatmaps, operand/operator labels")
    _common(p, samples=1000)
    _heads(p)
    p.set_defaults(func=cmd_attention)

    p = sub.add_parser("mlp", formatter_class=fmt,
                       help="MLP input/output vs unembedding of operands and answer, turning layers, one case")
    _common(p, samples=1000)
    p.add_argument("--case", help="prompt for the layer-by-layer case (default: '4 + 3 = ' with the data's prefix)")
    p.add_argument("--case-answer", default="7", help="the case's answer")
    p.set_defaults(func=cmd_mlp)

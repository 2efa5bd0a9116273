"""`keyheads knockout`, `keyheads attention` and `keyheads mlp`: validate and explain the key components."""
from __future__ import annotations

from ..config.commands import AttentionCommand, KnockoutCommand, MLPCommand
from .flags import add_settings, settings
from .models import load_from_args


def _selection(cfg):
    from ..analysis.run import Selection

    return Selection(heads=cfg.heads, effects=cfg.effects, threshold=cfg.threshold, top_k=cfg.top_k)


def cmd_knockout(args) -> int:
    from ..analysis.run import KnockoutRun, run_knockout

    cfg: KnockoutCommand = settings(args)
    run = KnockoutRun(data=cfg.data, out=cfg.out, selection=_selection(cfg), k=cfg.k, seeds=cfg.seeds,
                      seed=cfg.seed, n_samples=cfg.limit, batch_size=cfg.batch_size, mean_mode=cfg.mean_mode,
                      transfer=cfg.transfer, transfer_data=cfg.transfer_data, transfer_by=cfg.transfer_by,
                      data_dir=cfg.data_dir, transfer_n=cfg.transfer_n, transfer_control=cfg.transfer_control,
                      progress=not cfg.quiet)
    run_knockout(load_from_args(cfg), run)
    return 0


def cmd_attention(args) -> int:
    from ..analysis.run import AttentionRun, run_attention

    cfg: AttentionCommand = settings(args)
    run_attention(load_from_args(cfg), AttentionRun(data=cfg.data, out=cfg.out, selection=_selection(cfg),
                                               n_samples=cfg.limit, seed=cfg.seed, batch_size=cfg.batch_size,
                                               progress=not cfg.quiet))
    return 0


def cmd_mlp(args) -> int:
    from ..analysis.run import MLPRun, run_mlp

    cfg: MLPCommand = settings(args)
    run_mlp(load_from_args(cfg), MLPRun(data=cfg.data, out=cfg.out, n_samples=cfg.limit, seed=cfg.seed,
                                   batch_size=cfg.batch_size, case=cfg.case, case_answer=cfg.case_answer,
                                   progress=not cfg.quiet))
    return 0


def register(sub) -> None:
    p = sub.add_parser("knockout", help="mean-ablation knockout: effect-rank vs random-rank curves, key heads, transfer")
    add_settings(p, KnockoutCommand)
    p.set_defaults(func=cmd_knockout)

    p = sub.add_parser("attention", help="END-token attention of the key heads by token role, heatmaps, "
                       "operand/operator labels")
    add_settings(p, AttentionCommand)
    p.set_defaults(func=cmd_attention)

    p = sub.add_parser("mlp", help="MLP input/output vs unembedding of operands and answer, turning layers, one case")
    add_settings(p, MLPCommand)
    p.set_defaults(func=cmd_mlp)

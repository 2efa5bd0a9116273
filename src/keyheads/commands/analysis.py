"""`keyheads knockout`, `keyheads attention` and `keyheads mlp`: validate and explain the key components."""
from __future__ import annotations

from ..analysis.settings import AttentionSettings, KnockoutSettings, MLPSettings
from ..config.base import take
from ..config.commands import AttentionCommand, KnockoutCommand, MLPCommand
from ..selection import HeadChoice
from .flags import add_settings, settings
from .models import load_from_args
from .timing import work_time


def cmd_knockout(args) -> int:
    cfg: KnockoutCommand = settings(args)
    from .. import distributed
    from ..analysis.knockout_run import describe as describe_knockout
    from ..analysis.knockout_run import run_knockout

    model = load_from_args(cfg)
    with work_time("knockout", cfg.out):
        result = run_knockout(model, cfg.data, cfg.out, take(cfg, HeadChoice), take(cfg, KnockoutSettings),
                              transfer_data=cfg.transfer_data, data_dir=cfg.data_dir, batch_size=cfg.batch_size,
                              progress=not cfg.quiet)
        if distributed.is_main():
            print(describe_knockout(result))
    return 0


def cmd_attention(args) -> int:
    cfg: AttentionCommand = settings(args)
    from ..analysis.attention_run import describe as describe_attention
    from ..analysis.attention_run import run_attention

    model = load_from_args(cfg)
    with work_time("attention", cfg.out):
        result = run_attention(model, cfg.data, cfg.out, take(cfg, HeadChoice), take(cfg, AttentionSettings),
                               batch_size=cfg.batch_size, progress=not cfg.quiet)
        print(describe_attention(result))
    return 0


def cmd_mlp(args) -> int:
    cfg: MLPCommand = settings(args)
    from ..analysis.mlp_run import describe as describe_mlp
    from ..analysis.mlp_run import run_mlp

    model = load_from_args(cfg)
    with work_time("mlp", cfg.out):
        result = run_mlp(model, cfg.data, cfg.out, take(cfg, MLPSettings), batch_size=cfg.batch_size,
                         progress=not cfg.quiet)
        print(describe_mlp(result))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "knockout", help="mean-ablation knockout: effect-rank vs random-rank curves, key heads, transfer"
    )
    add_settings(p, KnockoutCommand)
    p.set_defaults(func=cmd_knockout)

    p = sub.add_parser("attention", help="END-token attention of the key heads by token role, heatmaps, "
                       "operand/operator labels")
    add_settings(p, AttentionCommand)
    p.set_defaults(func=cmd_attention)

    p = sub.add_parser("mlp", help="MLP input/output vs unembedding of operands and answer, turning layers, one case")
    add_settings(p, MLPCommand)
    p.set_defaults(func=cmd_mlp)

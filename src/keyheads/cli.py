"""The `keyheads` command. Each subcommand lives in keyheads/commands/<name>.py and has
`register(subparsers)`; adding a command is adding a module name below."""
from __future__ import annotations

import argparse
import importlib
import signal
import sys

from .errors import UserError
from .log import configure as configure_log
from .version import __version__

COMMAND_MODULES = (
    "keyheads.commands.models",
    "keyheads.commands.data",
    "keyheads.commands.identify",
    "keyheads.commands.eval",
    "keyheads.commands.analysis",
    "keyheads.commands.finetune",
    "keyheads.commands.run",
    "keyheads.commands.plan",
    "keyheads.commands.export",
    "keyheads.commands.faithfulness",
    "keyheads.commands.study",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keyheads",
        description="Find, explain and fine-tune the attention heads and MLPs that do arithmetic in a language model.",
        epilog="`keyheads demo` runs the whole study on the bundled model; `keyheads COMMAND -h` for each command.")
    parser.add_argument("--version", action="version", version=f"keyheads {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _stop_on_sigterm(signum, frame):
    # Batch schedulers and session ends send SIGTERM before killing; treating it as Ctrl-C lets
    # training save its finished steps and every stage stop cleanly on the same path.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_log(quiet=getattr(args, "quiet", False))
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        return int(args.func(args) or 0)
    except UserError as err:  # bad input: one line that says what to do; anything else is a bug and keeps its traceback
        print(f"keyheads {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; finished work is kept and a re-run resumes", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports Ctrl-C
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())

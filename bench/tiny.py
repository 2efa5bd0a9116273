"""The bench scripts' tiny mode (`--tiny`): a check that a script runs to its end in seconds, not a measurement.

A tiny randomly initialised Llama (keyheads.testing's, character tokenizer) saved as a model folder, a handful of
samples, one repetition, and the section written to a RESULTS file of its own (`--results`; by default one in a
temporary folder), never to bench/RESULTS.md. tests/test_bench_scripts.py runs every script so.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.results import RESULTS

# Few-shot prompts spelt character by character run past the tiny model's 256 positions; RoPE has no table to
# outgrow, so the saved config only widens the limit the evaluation checks prompts against.
CONTEXT = 4096
HELP = ("check the script end to end in seconds: a tiny random model, a handful of samples, one repetition; the "
        "section goes to --results, never to bench/RESULTS.md")


def add_flags(parser: argparse.ArgumentParser) -> None:
    """--tiny, and --results: where the section goes."""
    parser.add_argument("--tiny", action="store_true", help=HELP)
    parser.add_argument("--results", type=Path,
                        help="the RESULTS file the section goes to (default: bench/RESULTS.md; with --tiny, one "
                             "in a temporary folder)")


def parse(parser: argparse.ArgumentParser, sizes: dict, argv: list[str] | None = None) -> argparse.Namespace:
    """The parser's arguments; with --tiny, `sizes` replace the defaults (a flag given on the command line wins)."""
    args = parser.parse_args(argv)
    if args.tiny:
        parser.set_defaults(**sizes)
        args = parser.parse_args(argv)
    return args


def results_file(args: argparse.Namespace) -> Path:
    """The RESULTS file this run writes: --results, else bench/RESULTS.md, or with --tiny a temporary one."""
    if args.results is None:
        return scratch() / "RESULTS.md" if args.tiny else RESULTS
    if args.tiny and args.results.resolve() == RESULTS.resolve():
        raise SystemExit("--tiny writes no figure into bench/RESULTS.md: give another --results")
    return args.results


def scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="keyheads-bench-tiny-"))


def model_folder(folder: Path | None = None) -> Path:
    """keyheads.testing's tiny Llama saved as a model folder, which `--model` and load_model take."""
    from keyheads.testing import tiny_model

    folder = folder or scratch() / "tiny-llama"
    model = tiny_model("llama")
    model.hf.config.max_position_embeddings = CONTEXT
    model.hf.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    return folder

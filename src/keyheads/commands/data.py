"""`keyheads data`: reference / counterfactual prompt pairs as JSONL."""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from ..config.commands import DataCommand
from .flags import add_settings, settings
from .models import load_from_args

EPILOG = """\
template files (YAML):
  templates:
    - {id: my-add-1, task: addition, text: "{A} {OP:plus} {B} makes {C}"}
  {A} {B} operands, {C} the answer (last; the prompt is what precedes it), {OP:word} the operator the
  counterfactual replaces, {NAME} a pool word, {OBJECT~} a pool word the counterfactual changes.
  Own pools: `pools: {FRUIT: [kiwis, figs]}`; use the file with --template-files.
  Beyond arithmetic: `answer: IO` takes {C} from slot IO (no {A} {B} {OP}; the task is the template's own,
  e.g. ioi), and the counterfactual changes the ~ slots: configs/ioi-templates.yaml.
  Built-in templates: keyheads/data/templates/*.yaml.

output (one pair a line):
  {"task": "addition", "template": "add-eq-1", "reference": "3 + 5 = ", "counterfactual": "3 @ 5 = ",
   "answer": "8", "operands": {"A": "3", "B": "5"}, "positions": {"A": 0, "B": 3, "operator": 1}}
  positions are token indices in the unpadded tokenized prompt (special tokens and few-shot included).
"""


def cmd_data(args) -> int:
    cfg: DataCommand = settings(args)
    from ..data.generate import pairs_for
    from ..data.pairs import write_pairs

    t0 = time.perf_counter()
    model = load_from_args(cfg)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731  stdout stays for the summary
    pairs = pairs_for(model, cfg.pairs(), batch_size=cfg.batch_size, log=log,
                      progress=not cfg.quiet)
    write_pairs(cfg.out, pairs)
    counts = Counter(p.task for p in pairs)
    print(f"wrote {len(pairs)} pairs to {cfg.out} ({', '.join(f'{t} {n}' for t, n in counts.items())}) "
          f"in {time.perf_counter() - t0:.0f} s")
    return 0


def register(sub) -> None:
    p = sub.add_parser("data", help="make reference/counterfactual prompt pairs (JSONL)",
                       description="Make reference/counterfactual prompt pairs from the paper's templates "
                                   "(or your own), aligned token by token for the given model's tokenizer.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_settings(p, DataCommand)
    p.set_defaults(func=cmd_data)

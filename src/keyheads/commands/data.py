"""`keyheads data`: reference / counterfactual prompt pairs as JSONL."""
from __future__ import annotations

import argparse
import sys
import time

from .models import add_model_args, load_from_args

EPILOG = """\
template files (YAML):
  templates:
    - {id: my-add-1, task: addition, text: "{A} {OP:plus} {B} makes {C}"}
  {A} {B} operands, {C} the answer (last; the prompt is what precedes it), {OP:word} the operator the
  counterfactual replaces, {NAME} a pool word, {OBJECT~} a pool word the counterfactual changes.
  Own pools: `pools: {FRUIT: [kiwis, figs]}`. Built-in templates: keyheads/data/templates/*.yaml.

output (one pair a line):
  {"task": "addition", "template": "add-eq-1", "reference": "3 + 5 = ", "counterfactual": "3 @ 5 = ",
   "answer": "8", "operands": {"A": "3", "B": "5"}, "positions": {"A": 0, "B": 3, "operator": 1}}
  positions are token indices in the unpadded tokenized prompt (special tokens and few-shot included).
"""


def cmd_data(args) -> int:
    from ..data.generate import PairConfig, make_pairs, parse_operands
    from ..data.pairs import write_pairs
    from ..data.templates import TASKS, load_templates
    from ..settings import apply_common, check_int, check_writable_file

    apply_common(args)
    check_int("--n", args.n, 1)
    check_int("--few-shot", args.few_shot, 0)
    check_int("--batch-size", args.batch_size, 1)
    check_writable_file(args.out, "--out")
    a_range, b_range = parse_operands(args.operands)
    templates = load_templates(args.templates)
    if args.template:
        wanted = [i.strip() for group in args.template for i in group.split(",") if i.strip()]
        for tid in wanted:
            templates.get(tid)  # an unknown id fails here, listing the known ones
        templates.templates = [t for t in templates.templates if t.id in wanted]
    tasks = templates.tasks if args.task == "all" else [args.task]
    if args.task != "all" and args.task not in TASKS:
        raise ValueError(f"--task {args.task!r}: choose from {', '.join(TASKS)} or all")
    for task in tasks:
        if not templates.for_task(task):
            raise ValueError(f"no {task} templates among those selected")

    config = PairConfig(n=args.n, few_shot=args.few_shot, shared_prefix=args.shared_prefix, seed=args.seed, a_range=a_range, b_range=b_range,
                        allow_negative=args.allow_negative, allow_fractions=args.allow_fractions,
                        single_token_operands=not args.multi_token_operands,
                        single_token_answer=args.single_token_answer)
    t0 = time.perf_counter()
    model = load_from_args(args)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731  stdout stays for the summary
    pairs = make_pairs(templates, tasks, config, model=model, keep_correct=args.keep_correct,
                       batch_size=args.batch_size, log=log, progress=not args.quiet)
    write_pairs(args.out, pairs)
    counts = {t: sum(p.task == t for p in pairs) for t in tasks}
    print(f"wrote {len(pairs)} pairs to {args.out} ({', '.join(f'{t} {n}' for t, n in counts.items())}) "
          f"in {time.perf_counter() - t0:.0f} s")
    return 0


def register(sub) -> None:
    p = sub.add_parser("data", help="make reference/counterfactual prompt pairs (JSONL)",
                       description="Make reference/counterfactual prompt pairs from the paper's templates "
                                   "(or your own), aligned token by token for the given model's tokenizer.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, seed_help="picks operands, pool words and few-shot examples: the output is a function of the seed")
    p.add_argument("--task", default="addition",
                   help="addition, subtraction, multiplication, division, exponentiation or all (default: addition)")
    p.add_argument("--n", type=int, default=100, help="candidates per task, spread evenly over its templates (default: 100)")
    p.add_argument("--out", required=True, help="output .jsonl file")
    p.add_argument("--few-shot", type=int, default=0, metavar="K",
                   help="K solved examples of the same template before each prompt")
    p.add_argument("--shared-prefix", action="store_true",
                   help="the same K examples before every prompt of a template (drawn once per template), so "
                        "that analyses compute the shared prefix once")
    p.add_argument("--keep-correct", action="store_true",
                   help="keep only the pairs whose answer the model predicts (argmax) correctly")
    p.add_argument("--templates", action="append", metavar="FILE",
                   help="YAML template file to use instead of the built-in templates; repeatable; "
                        "the word 'builtin' adds the built-in ones")
    p.add_argument("--template", action="append", metavar="ID",
                   help="use only these template ids (repeatable or comma-separated), e.g. add-eq-1")
    p.add_argument("--operands", default="1-9", help="operand range LO-HI, or LO-HI,LO-HI for A and B (default: 1-9)")
    p.add_argument("--allow-negative", action="store_true", help="subtraction may have a negative answer")
    p.add_argument("--allow-fractions", action="store_true", help="division may have a non-integer answer")
    p.add_argument("--multi-token-operands", action="store_true",
                   help="accept operands that span several tokens (positions then point at the last one)")
    p.add_argument("--single-token-answer", action="store_true",
                   help="keep only answers that are a single token (default: the first token counts)")
    p.add_argument("--batch-size", type=int, default=32, help="prompts per forward pass for --keep-correct (default: 32)")
    p.set_defaults(func=cmd_data)

"""Built-in arithmetic benchmarks (`arith-*`): generated items, so no data folder is needed.

    arith-add      two-digit addition (10..99 + 10..99)
    arith-sub      two-digit subtraction, the larger operand first (no negative answers)
    arith-decimal  addition and subtraction (alternating) of one-decimal numbers, 10.0..99.9
    arith-mul      two-digit by two-digit multiplication (10..99 x 10..99)
    arith-add4     four-digit addition (1000..9999)
    arith-multi    three two-digit operands, two operations: A + B - C, A - B + C, A + B * C (in
                   turn; the last needs the precedence of *), answers never negative

The last three are for models that already solve the first three. arith-multi has three operands,
which the template syntax (one {A}, one {B}, one {OP}) cannot express: its questions are expressions
put into the phrasings of MULTI_PHRASINGS with str.format, and its answers are computed exactly by
EXPRESSIONS.

A prompt is k solved items of the same set, one a line, then the question:

    Q: Compute 4721 + 1038. A: 5759
    Q: Add 2290 and 7312. A: 9602
    Q: If you add 3348 to 1875, what do you get? A:

Held out from the arithmetic fine-tuning data (`--train arith:...`, i.e.
`keyheads.finetune.data.arithmetic_examples`) in two independent ways, checked by
`check_heldout` whenever the items are made, so that a change on either side fails loudly:
- phrasing: the questions come from HELDOUT_TEMPLATES below, which are not builtin templates
  (the training renders only builtin ones: data/templates/*.yaml);
- operands: every operand lies outside every range a training kind draws (ARITH_KINDS): two
  digits where training has three (100..999), five (10000..99999) or three by one (multiply),
  10.0..99.9 where it has 1.1..9.9, four digits (arith-add4) between training's three and five.
  (arith-add is two digits, not four: SmolLM2-135M gets 0% of four-digit sums, so a four-digit set
  could show no change on it.) arith-multi's phrasings are three-operand, which no builtin template is.

Each set is one fixed list (a string-seeded random stream: the same on every machine and in every
process): the first N_ITEMS are the test items, the next N_POOL the few-shot pool. No operand pair
(arith-multi: no shape with the same three operands) occurs twice in the list, so no exemplar repeats
a test question, in any phrasing.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from ..data.arithmetic import ARITH_KINDS, NumberRange, draw_exact, format_answer
from ..data.render import draw_fillers, render
from ..data.templates import Template, TemplateSet, build_template, load_templates

N_ITEMS = 300  # test items per set; --limit N takes the first N
N_POOL = 32  # exemplar pool per set, after the test items


@dataclass(frozen=True)
class ArithSpec:
    tasks: tuple[str, ...]  # cycled item by item: template tasks, or EXPRESSIONS shapes
    operands: NumberRange  # every operand


# three-operand shapes -> their exact value (integers only; * binds before + and -)
EXPRESSIONS = {
    "A + B - C": lambda a, b, c: a + b - c,
    "A - B + C": lambda a, b, c: a - b + c,
    "A + B * C": lambda a, b, c: a + b * c,
}

# the sets with room for the small bundled models (SmolLM2-135M, Gemma-3-270M): the demo's
ARITH_FIRST = ("arith-add", "arith-sub", "arith-decimal")

ARITH_SETS = {
    "arith-add": ArithSpec(("addition",), NumberRange("10", "99")),
    "arith-sub": ArithSpec(("subtraction",), NumberRange("10", "99")),
    "arith-decimal": ArithSpec(("addition", "subtraction"), NumberRange("10.0", "99.9")),
    "arith-mul": ArithSpec(("multiplication",), NumberRange("10", "99")),
    "arith-add4": ArithSpec(("addition",), NumberRange("1000", "9999")),
    "arith-multi": ArithSpec(tuple(EXPRESSIONS), NumberRange("10", "99")),
}

# In the builtin template syntax (keyheads.data.templates), for render(); items cycle through a
# task's phrasings. One line each and short, so that few-shot prompts stay small.
HELDOUT_TEMPLATES = [
    {"id": "add-heldout-1", "task": "addition", "text": "Q: Compute {A} {OP:+} {B}. A: {C}"},
    {"id": "add-heldout-2", "task": "addition", "text": "Q: {OP:Add} {A} and {B}. A: {C}"},
    {"id": "add-heldout-3", "task": "addition", "text": "Q: If you {OP:add} {A} to {B}, what do you get? A: {C}"},
    {"id": "sub-heldout-1", "task": "subtraction", "text": "Q: Compute {A} {OP:-} {B}. A: {C}"},
    {"id": "sub-heldout-2", "task": "subtraction", "text": "Q: {OP:Subtract} {B} from {A}. A: {C}"},
    {"id": "sub-heldout-3", "task": "subtraction",
     "text": "Q: If you {OP:take} {B} away from {A}, what is left? A: {C}"},
    {"id": "mul-heldout-1", "task": "multiplication", "text": "Q: Compute {A} {OP:*} {B}. A: {C}"},
    {"id": "mul-heldout-2", "task": "multiplication", "text": "Q: {OP:Multiply} {A} by {B}. A: {C}"},
    {"id": "mul-heldout-3", "task": "multiplication",
     "text": "Q: If you {OP:take} {A} groups of {B}, how many is that? A: {C}"},
]
# arith-multi's phrasings: {E} is the expression, e.g. "35 + 12 * 47"
MULTI_PHRASINGS = {
    "multi-heldout-1": "Q: Compute {E}. A:",
    "multi-heldout-2": "Q: What is the value of {E}? A:",
    "multi-heldout-3": "Q: Work out {E}. A:",
}


@dataclass(frozen=True)
class ArithItem:
    """One question: `question` is the prompt line up to "A:", `answer` the exact result as text;
    `c` is the third operand of arith-multi's expressions (`task`: the shape, e.g. "A + B * C")."""

    id: str
    task: str
    template: str
    a: str
    b: str
    question: str
    answer: str
    c: str | None = None


@cache
def builtin_templates() -> TemplateSet:
    return load_templates()


def heldout_templates() -> list[Template]:
    return [build_template(raw, builtin_templates().pools, source=__name__) for raw in HELDOUT_TEMPLATES]


def check_heldout(templates: Sequence[Template]) -> None:
    """Raise if the sets could share a question or an operand with the arithmetic training data."""
    builtin = builtin_templates().templates
    same = [t.id for t in templates if any(t.id == b.id or t.text == b.text for b in builtin)]
    if same:
        raise RuntimeError(f"held-out templates {', '.join(same)} are also builtin templates, which "
                           "`--train arith:...` renders; rename or rephrase them")
    same = [p for p in MULTI_PHRASINGS if any(p == b.id for b in builtin)]
    if same:
        raise RuntimeError(f"held-out phrasings {', '.join(same)} share the id of a builtin template; rename them")
    for name, spec in ARITH_SETS.items():
        for kind, (_, trained) in ARITH_KINDS.items():
            if spec.operands.overlaps(trained):
                raise RuntimeError(f"{name}: operands {spec.operands} overlap {trained}, which the training kind "
                                   f"{kind!r} draws; the set would not be held out")


@cache
def arith_items(name: str) -> tuple[tuple[ArithItem, ...], tuple[ArithItem, ...]]:
    """(test items, exemplar pool) of one set, always the same."""
    spec = ARITH_SETS[name]
    templates = heldout_templates()
    check_heldout(templates)
    pools = builtin_templates().pools
    by_task = {task: [t for t in templates if t.task == task] for task in spec.tasks if task not in EXPRESSIONS}
    rng = random.Random(f"keyheads.evaluation.arith:{name}")  # a str seed is hashed with sha512: stable
    out: list[ArithItem] = []
    seen: set[tuple[str | None, ...]] = set()
    while len(out) < N_ITEMS + N_POOL:
        i = len(out)
        task = spec.tasks[i % len(spec.tasks)]
        item_id = f"{name}/{i}" if i < N_ITEMS else f"{name}/shot-{i - N_ITEMS}"
        if task in EXPRESSIONS:
            item = _expression_item(item_id, task, i // len(spec.tasks), spec.operands, rng)
            if item is None or (task, item.a, item.b, item.c) in seen:
                continue
            seen.add((task, item.a, item.b, item.c))
            out.append(item)
            continue
        phrasings = by_task[task]
        template = phrasings[i // len(spec.tasks) % len(phrasings)]
        a, b, answer = draw_exact(task, spec.operands, rng)
        if (task, a, b) in seen:
            continue
        seen.add((task, a, b))
        # The template text before {C} ends with "A: "; the prompt stops at "A:" and the answer's
        # space is generated, as BPE tokenizers read " 5759" as one word.
        question = render(template, {"A": a, "B": b, **draw_fillers(template, pools, rng)}).text.rstrip()
        out.append(ArithItem(item_id, task, template.id, a, b, question, answer))
    return tuple(out[:N_ITEMS]), tuple(out[N_ITEMS:])


def _expression_item(item_id: str, shape: str, turn: int, operands: NumberRange,
                     rng: random.Random) -> ArithItem | None:
    """One arith-multi item of `shape`, phrased by the turn-th phrasing (cycling); None when the answer
    would be negative (the caller draws again)."""
    a, b, c = operands.draw(rng), operands.draw(rng), operands.draw(rng)
    value = EXPRESSIONS[shape](int(a), int(b), int(c))
    if value < 0:
        return None
    phrasing_id = list(MULTI_PHRASINGS)[turn % len(MULTI_PHRASINGS)]
    expression = shape.replace("A", a).replace("B", b).replace("C", c)
    question = MULTI_PHRASINGS[phrasing_id].format(E=expression)
    return ArithItem(item_id, shape, phrasing_id, a, b, question, format_answer(value), c)


def arith_prompt(question: str, exemplars: Sequence[ArithItem]) -> str:
    return "".join(f"{e.question} {e.answer}\n" for e in exemplars) + question

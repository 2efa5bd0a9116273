"""Figure 4 and appendix E: do the heads found on one dataset matter on data they were not found on?

Each transfer set is a list of prompts with the first token of the answer. The key heads are
knocked out (mean ablation with the identification data's counterfactual means) and the
top-1 accuracy is compared before and after; the relative drop is (after - before) / before,
as the paper reports it for SVAMP (34.7 -> 11.8, -66%).

Sets: another pairs file (per task and template), generated multi-digit additions
("281 + 135 = "), decimals ("4.2 plus 2.5 equals to "), year spans ("... from 1723 to 172"),
and SVAMP / GSM8K questions ending in "The answer is ". The generated and benchmark prompts take as many solved
examples as the identification data's prompts have (`shots`; each set has at most its own hand-written ones):
zero-shot when the data is zero-shot, as the paper's figure 4.
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..data.benchmarks import load
from ..knockout import Knockout
from ..models.model import HookedModel
from ..models.prompt_set import PromptSet
from ..numbers import format_number
from ..results.knockout import Case, TransferRow
from .common import AnalysisError, answer_token, fallback_note, read_pair_rows
from .passes import EndPasses

# Hand-written solved examples, one a line: not taken from any benchmark, so that nothing evaluated is shown.
WORD_FEW_SHOT = (
    "Tom has 3 apples. He buys 4 more apples. How many apples does Tom have now? The answer is 7.\n"
    "A box holds 9 pens. Sara takes 5 pens out of the box. How many pens are left in the box? The answer is 4.\n"
    "There are 12 birds on a tree and 15 more birds arrive. How many birds are on the tree now? The answer is 27.\n"
)
MULTIDIGIT_FEW_SHOT = "123 + 456 = 579\n310 + 207 = 517\n145 + 232 = 377\n"
DECIMAL_FEW_SHOT = "1.3 plus 2.4 equals to 3.7\n3.1 plus 1.5 equals to 4.6\n2.2 plus 4.3 equals to 6.5\n"
YEAR_FEW_SHOT = "The project lasted 3 years from 1841 to 1844.\nThe festival lasted 2 years from 1652 to 1654.\n"
EVENTS = ("war", "conflict", "project", "festival", "campaign", "siege")


@dataclass
class TransferSet:
    """name: row label; prompts/answers: what the model reads and the answer text; answer_ids:
    first answer token per prompt; case: index of the prompt printed as a figure-4 case."""

    name: str
    prompts: list[str]
    answers: list[str]
    answer_ids: list[int] = field(default_factory=list)
    case: int = 0
    note: str = ""


def examples(few_shot: str, shots: int) -> str:
    """The first `shots` lines of a set's hand-written examples (all of them when it has fewer)."""
    return "".join(line + "\n" for line in few_shot.splitlines()[:shots])


def data_shots(prompts: Sequence[str]) -> int:
    """How many solved examples, one a line, come before the question in every one of `prompts` (the templates'
    questions are one line; so are the examples `keyheads data --few-shot` adds)."""
    return min((p.count("\n") for p in prompts), default=0)


def _finish(model: HookedModel, name: str, prompts: Sequence[str], answers: Sequence[str], case: int = 0,
            note: str = "", join: str | None = None) -> TransferSet:
    """Attach answer tokens; prompts whose answer merges with their last token are left out (and counted)."""
    kept_p, kept_a, ids = [], [], []
    for i, (p, a) in enumerate(zip(prompts, answers)):
        try:
            p2, t = answer_token(model, p, a, join)
        except AnalysisError:
            case = case - 1 if i < case else case
            continue
        kept_p.append(p2)
        kept_a.append(str(a))
        ids.append(t)
    if not kept_p:
        raise AnalysisError(f"{name}: no prompt has an answer that starts a token of its own")
    dropped = len(prompts) - len(kept_p)
    if dropped:
        note = (note + "; " if note else "") + f"{dropped} left out (answer merges with the prompt's last token)"
    return TransferSet(name, kept_p, kept_a, ids, max(case, 0), note)


# ---- generated sets (the paper's figure 4 case first) -------------------------------------

def multidigit(model: HookedModel, n: int, seed: int = 0, shots: int = 3) -> TransferSet:
    rng = random.Random(seed)
    pairs = [(281, 135)] + [(rng.randint(100, 499), rng.randint(100, 499)) for _ in range(n - 1)]
    prompts = [f"{examples(MULTIDIGIT_FEW_SHOT, shots)}{a} + {b} = " for a, b in pairs]
    return _finish(model, "multi-digit (A + B, 3 digits)", prompts, [str(a + b) for a, b in pairs])


def decimal(model: HookedModel, n: int, seed: int = 0, shots: int = 3) -> TransferSet:
    rng = random.Random(seed)
    pairs = [(42, 25)] + [(rng.randint(10, 49), rng.randint(10, 49)) for _ in range(n - 1)]  # tenths
    prompts = [f"{examples(DECIMAL_FEW_SHOT, shots)}{a / 10:.1f} plus {b / 10:.1f} equals to " for a, b in pairs]
    return _finish(model, "decimal (A plus B)", prompts, [f"{(a + b) / 10:.1f}" for a, b in pairs])


def year_span(model: HookedModel, n: int, seed: int = 0, shots: int = 3) -> TransferSet:
    """'The war lasted 5 years from 1723 to 172' -> '8': the last digit of the end year."""
    rng = random.Random(seed)
    rows = [("war", 5, 1723)]
    while len(rows) < n:
        years = rng.randint(1, 8)
        start = rng.randint(1100, 1899)
        if start % 10 + years <= 9:  # the answer is the one digit that completes the year
            rows.append((rng.choice(EVENTS), years, start))
    shown = examples(YEAR_FEW_SHOT, shots)
    prompts = [f"{shown}The {e} lasted {y} years from {s} to {(s + y) // 10}" for e, y, s in rows]
    return _finish(model, "year span (time templates)", prompts, [str((s + y) % 10) for _, y, s in rows], join="")


def benchmark(model: HookedModel, name: str, data_dir: str | Path | None, n: int | None,
              seed: int = 0, prefer: str = "", shots: int = 3) -> TransferSet:
    """SVAMP or GSM8K questions: few-shot + question + ' The answer is '; target: first answer token."""
    records = load(name, data_dir=data_dir)
    if not records:
        raise AnalysisError(f"{name}: no questions found")
    order = list(range(len(records)))
    if n and n < len(records):
        order = sorted(random.Random(seed).sample(order, n))
        # keep the paper's printed case in the subset when the benchmark has it
        wanted = next((i for i, r in enumerate(records) if prefer and prefer in r.question), None)
        if wanted is not None and wanted not in order:
            order = sorted(order[1:] + [wanted])
    chosen = [records[i] for i in order]
    case = next((i for i, r in enumerate(chosen) if prefer and prefer in r.question), 0)
    prompts = [f"{examples(WORD_FEW_SHOT, shots)}{_sentence(r.question)} The answer is " for r in chosen]
    answers = [format_number(r.numeric_answer()) for r in chosen]
    return _finish(model, f"{name.upper()} (first answer token)", prompts, answers, case,
                   note=f"{len(chosen)} of {len(records)} questions")


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text if text.endswith(("?", ".", "!")) else text + "."


def from_pairs(model: HookedModel, path: str | Path, by: str = "task", n: int | None = None,
               seed: int = 0) -> list[TransferSet]:
    """One set per task (or template) of another pairs file, its reference prompts."""
    rows = read_pair_rows(path)
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(str(row.get(by) or "all"), []).append(row)
    sets = []
    for key, items in groups.items():
        if n and n < len(items):
            items = [items[i] for i in sorted(random.Random(seed).sample(range(len(items)), n))]
        sets.append(_finish(model, f"{Path(path).name}: {by} {key}", [r["reference"] for r in items],
                            [str(r["answer"]) for r in items]))
    return sets


# ---- evaluation ----------------------------------------------------------------------------

def evaluate(model: HookedModel, tset: TransferSet, ko: Knockout, batch_size: int = 16,
             progress: bool = True, controls: Sequence[Knockout] = ()) -> tuple[TransferRow, Case]:
    """Accuracy before and after the knockout on one set, and its figure-4 case.

    `controls` (draws of the same number of random heads) say how much of a drop any knockout of that size
    causes on this set: a transfer claim needs the key heads to do clearly more than their band."""
    prompts = PromptSet(model, tset.prompts, batch_size)
    sets = [[], list(ko.heads)] + [list(c.heads) for c in controls]
    if ko.mlps or any(c.mlps for c in controls):
        raise AnalysisError("transfer knocks out heads only")
    preds = EndPasses(model, prompts, ko).predict(sets, tset.answer_ids, topk=5, progress=progress)
    before, after = preds[0], preds[1]
    note = fallback_note(ko, prompts)
    row = TransferRow.measured(tset.name, len(tset.prompts), before.accuracy(tset.answer_ids),
                               after.accuracy(tset.answer_ids), note.text(), tset.note,
                               controls=[p.accuracy(tset.answer_ids) for p in preds[2:]])
    i = tset.case
    tok = model.tokenizer
    top = lambda pred: [(tok.decode([int(t)]), float(p)) for t, p in zip(pred.topk_ids[i], pred.topk_probs[i])]  # noqa: E731
    return row, Case(name=tset.name, prompt=tset.prompts[i], answer=tset.answers[i], before=top(before),
                     after=top(after))


def format_table(rows: Sequence[TransferRow]) -> str:
    width = max([len(r.set) for r in rows] + [10])
    lines = [f"{'set':<{width}}  {'n':>5}  {'before':>7}  {'after':>7}  {'relative':>8}",
             f"{'-' * width}  {'-' * 5}  {'-' * 7}  {'-' * 7}  {'-' * 8}"]
    for r in rows:
        rel = "n/a" if math.isnan(r.relative_change) else f"{r.relative_change:+.1%}"  # NaN: none right before
        lines.append(f"{r.set:<{width}}  {r.n:>5}  {r.accuracy_before:>7.1%}  {r.accuracy_after:>7.1%}  {rel:>8}")
    return "\n".join(lines)

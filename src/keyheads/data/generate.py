"""Making pairs: a sample per template, its aligned counterfactual, and the whole job with keep-correct.

The arithmetic is in arithmetic.py, filling templates in render.py, the tokenizer checks in
alignment.py and the correctness check in correct.py.

    make_pairs(load_templates(), ["addition"], PairSettings(n=100, few_shot=3), model=model, keep_correct=True)
"""
from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass

from ..errors import CounterfactualError, NothingCorrect, SettingError
from ..log import logger
from .alignment import SameLength, aligned
from .arithmetic import draw_operands
from .correct import TemplateScore, format_scores, predict_correct, score_table
from .pairs import POSITION_KEYS, Pair, answer_continuation, encode_with_offsets, span_tokens
from .render import Rendered, draw_fillers, left_context, render
from .settings import ALL, PairSettings, parse_tasks
from .templates import OPERANDS, Slot, Template, TemplateError, TemplateSet, load_templates, operator_pool


# ---- generation ---------------------------------------------------------------------------------
def prompt_end(tokenizer, prefix: str, text: str, answer: str) -> tuple[str, tuple[int, str, int]] | None:
    """Where the prompt `prefix + text` (the text before the answer) ends: with the space before the answer
    when the tokenizer gives that space a token of its own (then the next token is the digit), else before
    it. -> (the part of `text` kept, answer_continuation's (token, full text, count)); None when the answer
    does not start a token of its own either way."""
    stems = [text, text.rstrip(" ")] if text.endswith(" ") else [text]
    for stem in stems:
        found = answer_continuation(tokenizer, prefix + stem, answer)
        if found is not None and found[1] == prefix + text + answer:
            return stem, found
    return None


@dataclass
class Candidate:
    """A generated pair plus what the correctness check needs."""

    pair: Pair
    answer_token: int
    n_tokens: int


class Generator:
    """Makes aligned pairs for one tokenizer. `rejected` counts discarded samples by reason."""

    def __init__(self, templates: TemplateSet, tokenizer, config: PairSettings):
        self.templates, self.tokenizer, self.config = templates, tokenizer, config
        self.pools = templates.pools
        self.same_length = SameLength(tokenizer)
        self.rejected: Counter = Counter()
        self._shared: dict[str, tuple[str, set]] = {}

    def rng(self, template: Template) -> random.Random:
        # a string seed is hashed with sha512: stable across runs and Python processes
        return random.Random(f"{self.config.seed}:{template.id}")

    def few_shot_prefix(self, template: Template, rng: random.Random, query) -> str:
        lines = []
        for _ in range(self.config.few_shot):
            if template.answer is not None:  # prefer examples whose answer differs from the question's
                values, answer = self.draw_slots(template, rng, avoid=query)
                lines.append(render(template, values).text + answer)
                continue
            for _ in range(20):  # prefer examples whose operands differ from the question's
                drawn = draw_operands(template, self.config, rng)
                if drawn[:2] != query:
                    break
            a, b, answer = drawn
            values = {"A": a, "B": b, **draw_fillers(template, self.pools, rng)}
            lines.append(render(template, values).text + answer)
        return "".join(line + "\n" for line in lines)

    def draw_slots(self, template: Template, rng: random.Random, avoid: str | None = None) -> tuple[dict, str]:
        """Filler values of an answer-slot template and its answer (one other than `avoid` if 20 draws find it)."""
        slot = template.answer
        assert slot is not None  # only answer-slot templates come here
        for _ in range(20):
            values = draw_fillers(template, self.pools, rng)
            if values[slot] != avoid:
                break
        return values, values[slot]

    def shared(self, template: Template) -> tuple[str, set]:
        """The template's one few-shot prefix and the questions it shows, as `question` keys them (own
        random stream)."""
        if template.id not in self._shared:
            rng = random.Random(f"{self.config.seed}:{template.id}:prefix")
            examples: set = set()
            lines = []
            for _ in range(self.config.few_shot):
                if template.answer is not None:
                    values, answer = self.draw_slots(template, rng)
                    examples.add(answer)
                    lines.append(render(template, values).text + answer + "\n")
                    continue
                a, b, answer = draw_operands(template, self.config, rng)
                examples.add((a, b))
                values = {"A": a, "B": b, **draw_fillers(template, self.pools, rng)}
                lines.append(render(template, values).text + answer + "\n")
            self._shared[template.id] = ("".join(lines), examples)
        return self._shared[template.id]

    def sample(self, template: Template, rng: random.Random) -> Candidate | None:
        """One candidate, or None (counted in `rejected`) when the tokenizer rules it out."""
        if template.answer is not None:
            values, answer = self.draw_slots(template, rng)
            question: object = answer  # a few-shot example with the question's answer would give it away
        else:
            drawn = draw_operands(template, self.config, rng)
            if drawn is None:
                raise TemplateError(f"template {template.id}: no operands in {self.config.a_range} x "
                                    f"{self.config.b_range} give a valid {template.task} answer")
            a, b, answer = drawn
            values = {"A": a, "B": b, **draw_fillers(template, self.pools, rng)}
            question = (a, b)
        if self.config.shared_prefix:
            prefix, examples = self.shared(template)
            if question in examples:
                self.rejected["question repeats a few-shot example"] += 1
                return None
        else:
            prefix = self.few_shot_prefix(template, rng, question)
        ref = render(template, values)

        end = prompt_end(self.tokenizer, prefix, ref.text, answer)
        if end is None:
            self.rejected["answer does not start a token of its own"] += 1
            return None
        stem, found = end
        if self.config.single_token_answer and found[2] != 1:
            self.rejected["answer is several tokens"] += 1
            return None
        cut = len(ref.text) - len(stem)
        reference = prefix + stem
        ids, offsets = encode_with_offsets(self.tokenizer, reference)
        shift = lambda span: (span[0] + len(prefix), span[1] + len(prefix))  # noqa: E731
        positions = None  # an answer-slot template has no operands or operator to point at
        if template.answer is None:
            positions = self._positions(reference, offsets, {k: shift(v) for k, v in ref.spans.items()})
            if positions is None:
                return None

        for _ in range(self.config.counterfactual_tries):
            cf = self._counterfactual(template, values, rng)
            counterfactual = prefix + cf.text[:len(cf.text) - cut]
            cf_ids, cf_offsets = encode_with_offsets(self.tokenizer, counterfactual)
            changed = cf_ids != ids if positions is None else \
                cf_ids[positions["operator"]] != ids[positions["operator"]]
            if changed and self._aligned(ids, offsets, [shift(s) for s in ref.changed],
                                         cf_ids, cf_offsets, [shift(s) for s in cf.changed]):
                break
        else:
            pools = "its ~ slots' pools" if template.answer is not None else \
                f"the {operator_pool(template)} pool (or to the pools of its ~ slots)"
            raise CounterfactualError(
                f"template {template.id}: no counterfactual of {len(ids)} tokens found for {reference!r} "
                f"in {self.config.counterfactual_tries} tries; add words of the same token count to {pools}")
        operands = None if template.answer is not None else {"A": values["A"], "B": values["B"]}
        pair = Pair(reference, counterfactual, answer, template.task, template.id, operands, positions)
        return Candidate(pair, found[0], len(ids))

    def _positions(self, text: str, offsets, spans) -> dict[str, int] | None:
        positions = {}
        for key in POSITION_KEYS:
            toks = span_tokens(offsets, *spans[key])
            if not toks:  # the tokenizer gave this span no token of its own (dropped or merged characters)
                self.rejected[f"{key} has no token"] += 1
                return None
            if key in OPERANDS and self.config.single_token_operands:
                s, e = spans[key]
                if len(toks) != 1 or text[offsets[toks[0]][0]:offsets[toks[0]][1]].strip() != text[s:e]:
                    self.rejected["operand is not a single token"] += 1
                    return None
            positions[key] = toks[-1]
        return positions

    def _counterfactual(self, template: Template, values: dict, rng: random.Random) -> Rendered:
        pools, parts = self.pools, template.parts
        choices: list[str] = []
        if template.answer is None:  # arithmetic: the operator's word or symbol is replaced
            op = template.operator
            assert op.word is not None  # the OP slot always has its word (build_template checks)
            left = left_context(parts, parts.index(op), values)
            choices = self.same_length(operator_pool(template), pools[operator_pool(template)], op.word, left)
            if not choices:
                raise CounterfactualError(
                    f"template {template.id}: no {operator_pool(template)} pool entry tokenizes like the operator "
                    f"{op.word!r}; add one with the same token count")
        swaps = {}
        for i, part in enumerate(parts):
            if isinstance(part, Slot) and part.resample:
                pool = template.pool_of[part.name]
                # a value no slot of this pool holds: IOI's third name, never the other name
                held = {values[name] for name, p in template.pool_of.items() if p == pool}
                same = [v for v in self.same_length(pool, pools[pool], values[part.name],
                                                    left_context(parts, i, values)) if v not in held]
                if not same:
                    raise CounterfactualError(f"template {template.id}: no value of pool {pool} other than "
                                              f"{', '.join(sorted(held))} tokenizes like {values[part.name]!r} "
                                              f"for slot {{{part.name}~}}; add values of the same token count")
                swaps[i] = rng.choice(same)
        return render(template, values, rng.choice(choices) if choices else None, swaps)

    _aligned = staticmethod(aligned)  # (tests call it here)

    def task(self, task: str, log=logger.info) -> list[Candidate]:
        """config.n candidates for `task`, spread evenly over its templates."""
        templates = self.templates.for_task(task)
        if not templates:
            raise TemplateError(f"no templates for task {task}")
        usable = []
        for t in templates:  # a template whose constraints no operand pair meets is skipped, loudly
            if t.answer is None and draw_operands(t, self.config, random.Random(0)) is None:
                log(f"  {t.id}: skipped, no operands in {self.config.a_range} x {self.config.b_range} "
                    f"satisfy it (max_answer={t.max_answer})")
            else:
                usable.append(t)
        if not usable:
            raise TemplateError(f"task {task}: no template can be filled with operands "
                                f"{self.config.a_range} x {self.config.b_range}")
        out = []
        for k, t in enumerate(usable):
            want = self.config.n // len(usable) + (k < self.config.n % len(usable))
            rng, tries = self.rng(t), 0
            got: list[Candidate] = []
            while len(got) < want and tries < 20 * want + 100:
                tries += 1
                c = self.sample(t, rng)
                if c is not None:
                    got.append(c)
            if len(got) < want:
                log(f"  {t.id}: only {len(got)} of {want} samples fit the tokenizer")
            out.extend(got)
        if self.rejected:
            log("  rejected: " + ", ".join(f"{why} ({n})" for why, n in self.rejected.items()))
        if not out:
            hint = " (multi-digit operands need --multi-token-operands, i.e. single_token_operands=False)" \
                if self.rejected["operand is not a single token"] else ""
            raise TemplateError(f"task {task}: every sample was rejected{hint}")
        return out


# ---- the whole job ------------------------------------------------------------------------------
def pairs_for(model, config: PairSettings, batch_size: int = 32, log=logger.info, progress: bool = True) -> list[Pair]:
    """The pairs `config` asks for, from its tasks' templates (the built-in ones, or config.template_files),
    kept correct by `model` if config.keep_correct: the data step of `keyheads data` and of a run."""
    templates = load_templates(config.template_files or None)
    known = templates.tasks
    if config.templates:
        templates.templates = [t for t in templates.templates if t.id in config.templates]
    tasks = templates.tasks if config.task == ALL else parse_tasks(config.task, known)
    for task in tasks:
        if not templates.for_task(task):
            raise SettingError(f"task {task}: no {task} templates among those selected ({', '.join(config.templates)})")
    return make_pairs(templates, tasks, config, model=model, keep_correct=config.keep_correct, batch_size=batch_size,
                      log=log, progress=progress)


def make_pairs(templates: TemplateSet, tasks: list[str], config: PairSettings, tokenizer=None, model=None,
               keep_correct: bool = False, batch_size: int = 32, log=logger.info,
               progress: bool = True) -> list[Pair]:
    """Generate config.n candidates per task; with keep_correct, keep only those `model` gets right.

    Raises NothingCorrect when the model gets none right (the accuracy per template is logged).
    """
    tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    gen = Generator(templates, tokenizer, config)
    kept: list[Pair] = []
    all_scores: list = []
    for task in tasks:
        log(f"{task}: generating {config.n} candidates")
        gen.rejected.clear()
        candidates = gen.task(task, log=log)
        if not keep_correct:
            kept.extend(c.pair for c in candidates)
            continue
        right, scores = correct_ones(model, task, candidates, batch_size, log, progress)
        all_scores.extend(scores)
        kept.extend(right)
    if keep_correct and not kept:  # the accuracy per template was logged above, task by task
        total = sum(score.total for score in all_scores)
        raise NothingCorrect(f"the model predicted none of the {total} prompts correctly (accuracy per template "
                             "above), so --keep-correct keeps nothing: give examples first (--few-shot 3), or "
                             "leave out --keep-correct")
    return kept


def correct_ones(model, name: str, candidates: list[Candidate], batch_size: int = 32, log=logger.info,
                 progress: bool = True) -> tuple[list[Pair], list[TemplateScore]]:
    """The pairs of `candidates` whose answer `model` predicts, and the accuracy per template (logged)."""
    t0 = time.perf_counter()
    ok = predict_correct(model, candidates, batch_size, desc=name, progress=progress)
    scores = score_table(candidates, ok)
    log(f"{name}: accuracy per template ({time.perf_counter() - t0:.0f} s)\n{format_scores(scores)}")
    if not any(ok):
        log(f"{name}: the model got nothing right; no {name} pairs")
    return [c.pair for c, good in zip(candidates, ok) if good], scores

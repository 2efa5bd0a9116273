"""Reference / counterfactual prompt pairs, the input of every analysis.

A reference prompt X_r asks for a calculation ("3 + 5 = "), its counterfactual X_c has the same
structure and token count but no calculation logic ("3 @ 5 = "): the operator is replaced by a
nonsense word or symbol. Files are JSONL, one pair a line:

    {"task": "addition", "template": "add-eq-1", "reference": "3 + 5 = ", "counterfactual": "3 @ 5 = ",
     "answer": "8", "operands": {"A": "3", "B": "5"}, "positions": {"A": 0, "B": 3, "operator": 1}}

`positions` index the tokenized prompt as the tokenizer returns it with special tokens (BOS...) and
any few-shot prefix, i.e. unpadded: a left-padded batch shifts them by the padding. The answer token
is the first token of the answer after the prompt (`answer_token_id`); tokenizers that put the space
before a number in a token of its own get prompts ending with that space, so that the next token is
the digit.
"""
from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from ..io import MalformedLine, iter_jsonl, write_jsonl
from .templates import OPERANDS, Slot, Template, TemplateError, TemplateSet, operator_pool

POSITION_KEYS = ("A", "B", "operator")


# ---- the file format ----------------------------------------------------------------------------
@dataclass
class Pair:
    """One reference / counterfactual pair.

    reference, counterfactual: the prompts, ending where the answer starts (same token count).
    answer: the correct answer as text, e.g. "8"; the model should predict its first token.
    task, template: where it came from (None when read from a minimal file).
    operands: {"A": "3", "B": "5"}.
    positions: token index of operand A, operand B and the operator in both prompts (the last token
        of each when it spans several), or None when unknown.
    """

    reference: str
    counterfactual: str
    answer: str
    task: str | None = None
    template: str | None = None
    operands: dict[str, str] | None = None
    positions: dict[str, int] | None = None

    def to_dict(self) -> dict:
        return {"task": self.task, "template": self.template, "reference": self.reference,
                "counterfactual": self.counterfactual, "answer": self.answer,
                "operands": self.operands, "positions": self.positions}


def write_pairs(path: str | Path, pairs) -> Path:
    """Write pairs as JSONL, atomically: a crash leaves the old file or the new one, never half."""
    return write_jsonl(path, (p.to_dict() for p in pairs))


def read_pairs(path: str | Path) -> list[Pair]:
    """Read a pairs file. Only reference, counterfactual and answer are required; a malformed line
    raises MalformedLine naming the file and line number."""
    pairs = []
    for number, obj in iter_jsonl(path):
        def bad(why: str) -> MalformedLine:
            return MalformedLine(f"{path}:{number}: {why}")

        for key in ("reference", "counterfactual"):
            if not isinstance(obj.get(key), str) or not obj[key]:
                raise bad(f"`{key}` must be a non-empty string")
        answer = obj.get("answer")
        if isinstance(answer, int) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str) or not answer.strip():
            raise bad("`answer` must be a non-empty string")
        for key in ("task", "template"):
            if obj.get(key) is not None and not isinstance(obj[key], str):
                raise bad(f"`{key}` must be a string")
        operands = obj.get("operands")
        if operands is not None:
            if not isinstance(operands, dict):
                raise bad("`operands` must be an object")
            operands = {str(k): str(v) for k, v in operands.items()}
        positions = obj.get("positions")
        if positions is not None:
            if not isinstance(positions, dict) or any(k not in positions for k in POSITION_KEYS):
                raise bad(f"`positions` must be an object with {', '.join(POSITION_KEYS)}")
            if not all(isinstance(positions[k], int) and not isinstance(positions[k], bool)
                       and positions[k] >= 0 for k in POSITION_KEYS):
                raise bad("`positions` values must be non-negative integers")
            positions = {k: positions[k] for k in POSITION_KEYS}
        pairs.append(Pair(obj["reference"], obj["counterfactual"], answer, obj.get("task"),
                          obj.get("template"), operands, positions))
    return pairs


# ---- tokenizer helpers --------------------------------------------------------------------------
def encode_with_offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids with special tokens, and each token's character span (special tokens: empty)."""
    enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def span_tokens(offsets, start: int, end: int) -> list[int]:
    """Indices of the tokens that overlap characters [start, end)."""
    return [i for i, (s, e) in enumerate(offsets) if e > s and s < end and e > start]


def _continuation(tokenizer, prompt: str, answer: str) -> tuple[int, str, int] | None:
    """(first answer token, full text, answer token count) when `answer` follows `prompt` without
    changing the prompt's tokens.

    A prompt not ending in whitespace is first tried with a space before the answer (" 8" as in
    "3 + 5 = 8"), then without ("153" + "7" in "the year 1537").
    """
    ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    joins = [""] if prompt[-1:].isspace() else [" ", ""]
    for join in joins:
        full = prompt + join + answer
        full_ids = tokenizer(full, add_special_tokens=True)["input_ids"]
        if len(full_ids) <= len(ids) or list(full_ids[:len(ids)]) != list(ids):
            continue
        token = full_ids[len(ids)]
        piece = tokenizer.decode([token]).strip()
        if piece and answer.startswith(piece):
            return token, full, len(full_ids) - len(ids)
    return None


def answer_token_id(tokenizer, prompt: str, answer: str) -> int:
    """The token a model must predict after `prompt`: the first token of the answer."""
    found = _continuation(tokenizer, prompt, answer)
    if found is None:
        raise ValueError(f"the answer {answer!r} does not start a token of its own after {prompt!r}")
    return found[0]


def verify_pair(tokenizer, pair: Pair) -> list[str]:
    """What is wrong with a pair for this tokenizer (empty when it is aligned and positions point
    at the operands and the operator)."""
    problems = []
    ref_ids, ref_off = encode_with_offsets(tokenizer, pair.reference)
    cf_ids, _ = encode_with_offsets(tokenizer, pair.counterfactual)
    if len(ref_ids) != len(cf_ids):
        problems.append(f"reference has {len(ref_ids)} tokens, counterfactual {len(cf_ids)}")
    if _continuation(tokenizer, pair.reference, pair.answer) is None:
        problems.append(f"answer {pair.answer!r} does not start a token after the reference")
    if pair.positions is None:
        return problems
    for key in POSITION_KEYS:
        if not 0 <= pair.positions[key] < len(ref_ids):
            problems.append(f"position {key}={pair.positions[key]} outside the {len(ref_ids)} tokens")
    if problems:
        return problems
    if len(cf_ids) == len(ref_ids):
        for key in OPERANDS:  # operands are the same tokens in both prompts, the operator is not
            if ref_ids[pair.positions[key]] != cf_ids[pair.positions[key]]:
                problems.append(f"operand {key} differs between reference and counterfactual")
        if ref_ids[pair.positions["operator"]] == cf_ids[pair.positions["operator"]]:
            problems.append("the operator token is the same in reference and counterfactual")
    for key in OPERANDS if pair.operands else ():
        s, e = ref_off[pair.positions[key]]
        token, operand = pair.reference[s:e].strip(), pair.operands[key]
        # a single-token operand is that token; a multi-token one ends with it
        if not token or not operand.endswith(token):
            problems.append(f"position {key} points at {pair.reference[s:e]!r}, not at operand {operand!r}")
    return problems


# ---- configuration ------------------------------------------------------------------------------
@dataclass
class PairConfig:
    """How pairs are generated.

    n: candidates per task, spread evenly over the task's templates (before --keep-correct).
    few_shot: solved examples of the same template before each prompt, one a line. Reference and
        counterfactual share them, so that only the final question differs.
    seed: everything is deterministic given the seed; each template has its own random stream,
        so adding a template or a task does not change the others' pairs.
    a_range, b_range: operand ranges, both ends included (the paper: 1..9).
    allow_negative: subtraction may give a negative answer.
    allow_fractions: division may give a non-integer answer (written with up to two decimals).
    single_token_operands: reject samples whose operand spans several tokens (the paper's setting;
        turn off for multi-digit operands with digit-splitting tokenizers).
    single_token_answer: reject samples whose whole answer is more than one token ("12" with a
        digit-splitting tokenizer); by default the answer token is the first one, as in the paper.
    counterfactual_tries: counterfactual draws per sample before giving up on alignment.
    """

    n: int = 100
    few_shot: int = 0
    seed: int = 0
    a_range: tuple[int, int] = (1, 9)
    b_range: tuple[int, int] = (1, 9)
    allow_negative: bool = False
    allow_fractions: bool = False
    single_token_operands: bool = True
    single_token_answer: bool = False
    counterfactual_tries: int = 50


def parse_operands(text: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """"1-9" -> both operands in 1..9; "10-99,1-9" -> A in 10..99, B in 1..9."""
    ranges = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            lo, hi = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"--operands {text!r}: expected LO-HI or LO-HI,LO-HI, e.g. 1-9") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"--operands {text!r}: need 0 <= LO <= HI")
        ranges.append((lo, hi))
    if len(ranges) not in (1, 2):
        raise ValueError(f"--operands {text!r}: give one range or two (A,B)")
    return ranges[0], ranges[-1]


# ---- answers ------------------------------------------------------------------------------------
def compute_answer(task: str, a: int, b: int, config: PairConfig):
    """The answer as a number, or None when the task's rules exclude these operands."""
    if task == "addition":
        return a + b
    if task == "subtraction":
        return a - b if a >= b or config.allow_negative else None
    if task == "multiplication":
        return a * b
    if task == "division":
        if b == 0:
            return None
        q = Fraction(a, b)
        return q if q.denominator == 1 or config.allow_fractions else None
    if task == "exponentiation":
        return a ** b
    raise ValueError(f"unknown task {task!r}")


def format_answer(value) -> str:
    if isinstance(value, Fraction):
        if value.denominator == 1:
            return str(value.numerator)
        return f"{float(value):.2f}".rstrip("0").rstrip(".")
    return str(value)


def draw_operands(template: Template, config: PairConfig, rng: random.Random, tries: int = 10_000):
    """(A, B, answer text) uniform over the operand pairs the task and template allow, or None."""
    for _ in range(tries):
        a, b = rng.randint(*config.a_range), rng.randint(*config.b_range)
        value = compute_answer(template.task, a, b, config)
        if value is not None and (template.max_answer is None or value <= template.max_answer):
            return str(a), str(b), format_answer(value)
    return None


# ---- rendering ----------------------------------------------------------------------------------
@dataclass
class Rendered:
    text: str                                   # the prompt stem: the template text before {C}
    spans: dict[str, tuple[int, int]]           # "A", "B", "operator" -> character span
    changed: list[tuple[int, int]] = field(default_factory=list)  # spans a counterfactual replaces


def render(template: Template, values: dict[str, str], op_word: str | None = None,
           swaps: dict[int, str] | None = None) -> Rendered:
    """Fill a template. `op_word` and `swaps` (part index -> value for ~ slots) make a counterfactual."""
    out, spans, changed, n = [], {}, [], 0
    for i, part in enumerate(template.parts[:-1]):  # the last part is {C}
        if isinstance(part, str):
            piece = part
        elif part.name == "OP":
            piece = op_word if op_word is not None else part.word
        elif swaps is not None and i in swaps:
            piece = swaps[i]
        else:
            piece = values[part.name]
        if isinstance(part, Slot):
            span = (n, n + len(piece))
            if part.name in OPERANDS:
                spans[part.name] = span
            elif part.name == "OP":
                spans["operator"] = span
            if part.name == "OP" or part.resample:
                changed.append(span)
        out.append(piece)
        n += len(piece)
    return Rendered("".join(out), spans, changed)


def draw_fillers(template: Template, pools: dict, rng: random.Random) -> dict[str, str]:
    """One value per filler slot; slots sharing a pool (NAME, NAME2) get different values."""
    values, taken = {}, {}
    for name in template.fillers:
        pool = template.pool_of[name]
        used = taken.setdefault(pool, set())
        choices = [v for v in pools[pool] if v not in used] or pools[pool]
        values[name] = rng.choice(choices)
        used.add(values[name])
    return values


class CounterfactualError(ValueError):
    """No counterfactual with the reference's token count could be drawn."""


class _SameLength:
    """Pool values that tokenize like a given value in a given left context (cached per tokenizer)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.cache = tokenizer, {}

    def __call__(self, pool: str, values: list[str], reference: str, left: str) -> list[str]:
        key = (pool, reference, left)
        if key not in self.cache:
            n = lambda v: len(self.tokenizer(left + v, add_special_tokens=False)["input_ids"])  # noqa: E731
            target = n(reference)
            self.cache[key] = [v for v in values if v != reference and n(v) == target]
        return self.cache[key]


# ---- generation ---------------------------------------------------------------------------------
@dataclass
class Candidate:
    """A generated pair plus what the correctness check needs."""

    pair: Pair
    answer_token: int
    n_tokens: int


class Generator:
    """Makes aligned pairs for one tokenizer. `rejected` counts discarded samples by reason."""

    def __init__(self, templates: TemplateSet, tokenizer, config: PairConfig):
        self.templates, self.tokenizer, self.config = templates, tokenizer, config
        self.pools = templates.pools
        self.same_length = _SameLength(tokenizer)
        self.rejected: Counter = Counter()

    def rng(self, template: Template) -> random.Random:
        # a string seed is hashed with sha512: stable across runs and Python processes
        return random.Random(f"{self.config.seed}:{template.id}")

    def few_shot_prefix(self, template: Template, rng: random.Random, query: tuple[str, str]) -> str:
        lines = []
        for _ in range(self.config.few_shot):
            for _ in range(20):  # prefer examples whose operands differ from the question's
                drawn = draw_operands(template, self.config, rng)
                if drawn[:2] != query:
                    break
            a, b, answer = drawn
            values = {"A": a, "B": b, **draw_fillers(template, self.pools, rng)}
            lines.append(render(template, values).text + answer)
        return "".join(line + "\n" for line in lines)

    def sample(self, template: Template, rng: random.Random) -> Candidate | None:
        """One candidate, or None (counted in `rejected`) when the tokenizer rules it out."""
        drawn = draw_operands(template, self.config, rng)
        if drawn is None:
            raise TemplateError(f"template {template.id}: no operands in {self.config.a_range} x "
                                f"{self.config.b_range} give a valid {template.task} answer")
        a, b, answer = drawn
        values = {"A": a, "B": b, **draw_fillers(template, self.pools, rng)}
        prefix = self.few_shot_prefix(template, rng, (a, b))
        ref = render(template, values)

        # Where the prompt ends: with the space before the answer when the tokenizer gives that
        # space a token of its own (then the next token is the digit), else before it.
        stems = [ref.text, ref.text.rstrip(" ")] if ref.text.endswith(" ") else [ref.text]
        natural = prefix + ref.text + answer
        for stem in stems:
            found = _continuation(self.tokenizer, prefix + stem, answer)
            if found is not None and found[1] == natural:
                break
        else:
            self.rejected["answer does not start a token of its own"] += 1
            return None
        if self.config.single_token_answer and found[2] != 1:
            self.rejected["answer is several tokens"] += 1
            return None
        cut = len(ref.text) - len(stem)
        reference = prefix + stem
        ids, offsets = encode_with_offsets(self.tokenizer, reference)
        shift = lambda span: (span[0] + len(prefix), span[1] + len(prefix))  # noqa: E731
        positions = self._positions(reference, offsets, {k: shift(v) for k, v in ref.spans.items()})
        if positions is None:
            return None

        for _ in range(self.config.counterfactual_tries):
            cf = self._counterfactual(template, values, rng)
            counterfactual = prefix + cf.text[:len(cf.text) - cut]
            cf_ids, cf_offsets = encode_with_offsets(self.tokenizer, counterfactual)
            if self._aligned(ids, offsets, [shift(s) for s in ref.changed],
                             cf_ids, cf_offsets, [shift(s) for s in cf.changed]) \
                    and cf_ids[positions["operator"]] != ids[positions["operator"]]:
                break
        else:
            raise CounterfactualError(
                f"template {template.id}: no counterfactual of {len(ids)} tokens found for {reference!r} "
                f"in {self.config.counterfactual_tries} tries; add words of the same token count to the "
                f"{operator_pool(template)} pool (or to the pools of its ~ slots)")
        pair = Pair(reference, counterfactual, answer, template.task, template.id, {"A": a, "B": b}, positions)
        return Candidate(pair, found[0], len(ids))

    def _positions(self, text: str, offsets, spans) -> dict[str, int] | None:
        positions = {}
        for key in POSITION_KEYS:
            toks = span_tokens(offsets, *spans[key])
            if key in OPERANDS and self.config.single_token_operands:
                s, e = spans[key]
                if len(toks) != 1 or text[offsets[toks[0]][0]:offsets[toks[0]][1]].strip() != text[s:e]:
                    self.rejected["operand is not a single token"] += 1
                    return None
            positions[key] = toks[-1]
        return positions

    def _counterfactual(self, template: Template, values: dict, rng: random.Random) -> Rendered:
        pools, parts = self.pools, template.parts
        op = template.operator
        left = _left_context(parts, parts.index(op), values)
        choices = self.same_length(operator_pool(template), pools[operator_pool(template)], op.word, left)
        if not choices:
            raise CounterfactualError(
                f"template {template.id}: no {operator_pool(template)} pool entry tokenizes like the operator "
                f"{op.word!r}; add one with the same token count")
        swaps = {}
        for i, part in enumerate(parts):
            if isinstance(part, Slot) and part.resample:
                pool = template.pool_of[part.name]
                same = self.same_length(pool, pools[pool], values[part.name], _left_context(parts, i, values))
                if not same:
                    raise CounterfactualError(f"template {template.id}: no other value of pool {pool} tokenizes "
                                              f"like {values[part.name]!r} for slot {{{part.name}~}}")
                swaps[i] = rng.choice(same)
        return render(template, values, rng.choice(choices), swaps)

    @staticmethod
    def _aligned(ids, offsets, changed, cf_ids, cf_offsets, cf_changed) -> bool:
        """Same token count, replaced spans on the same tokens, every other token identical."""
        if len(ids) != len(cf_ids):
            return False
        free = set(range(len(ids)))
        for span, cf_span in zip(changed, cf_changed):
            toks = span_tokens(offsets, *span)
            if toks != span_tokens(cf_offsets, *cf_span):
                return False
            free -= set(toks)
        return all(ids[i] == cf_ids[i] for i in free)

    def task(self, task: str, log=print) -> list[Candidate]:
        """config.n candidates for `task`, spread evenly over its templates."""
        templates = self.templates.for_task(task)
        if not templates:
            raise TemplateError(f"no templates for task {task}")
        usable = []
        for t in templates:  # a template whose constraints no operand pair meets is skipped, loudly
            if draw_operands(t, self.config, random.Random(0)) is None:
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
            rng, got, tries = self.rng(t), [], 0
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
            hint = " (multi-digit operands need single_token_operands off)" \
                if self.rejected.get("operand is not a single token") else ""
            raise TemplateError(f"task {task}: every sample was rejected{hint}")
        return out


def _left_context(parts, index: int, values: dict) -> str:
    """The character before slot `index` as rendered (a space changes how BPE tokenizes a word)."""
    if index == 0:
        return ""
    prev = parts[index - 1]
    prev = prev if isinstance(prev, str) else (prev.word if prev.name == "OP" else values.get(prev.name, ""))
    return prev[-1:] if prev[-1:].isspace() else ""


# ---- keeping what the model gets right ----------------------------------------------------------
class NothingCorrect(ValueError):
    """The model predicted no candidate correctly."""


@dataclass
class TemplateScore:
    template: str
    total: int = 0
    correct: int = 0

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


def predict_next(model, prompts: list[str], batch_size: int = 32, desc: str = "predicting",
                 answers: list[int] | None = None) -> list[int]:
    """The model's argmax next token after each prompt, batched.

    Batches hold prompts of similar length so that little compute goes to padding. With `answers`
    the progress bar shows the running accuracy.
    """
    import torch
    from tqdm.auto import tqdm

    lengths = [len(model.tokenizer(p)["input_ids"]) for p in prompts]
    order = sorted(range(len(prompts)), key=lengths.__getitem__)
    pred = [0] * len(prompts)
    right = 0
    with torch.inference_mode(), tqdm(total=len(order), desc=desc, unit="prompt") as bar:
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            batch = model.encode([prompts[i] for i in chunk])
            try:  # only the last position's logits are needed: skip the rest of the vocab projection
                logits = model.forward(batch, logits_to_keep=1)[:, -1]
            except TypeError:
                logits = model.forward(batch)[:, -1]
            for i, p in zip(chunk, logits.argmax(-1).tolist()):
                pred[i] = p
                right += answers is not None and p == answers[i]
            bar.update(len(chunk))
            if answers is not None:
                bar.set_postfix(acc=f"{right / bar.n:.0%}")
    return pred


def predict_correct(model, candidates: list[Candidate], batch_size: int = 32, desc: str = "checking") -> list[bool]:
    """Whether the model's argmax next token after each reference is the answer token."""
    answers = [c.answer_token for c in candidates]
    pred = predict_next(model, [c.pair.reference for c in candidates], batch_size, desc, answers)
    return [p == a for p, a in zip(pred, answers)]


def score_table(candidates: list[Candidate], ok: list[bool]) -> list[TemplateScore]:
    scores: dict[str, TemplateScore] = {}
    for c, good in zip(candidates, ok):
        s = scores.setdefault(c.pair.template, TemplateScore(c.pair.template))
        s.total += 1
        s.correct += good
    return list(scores.values())


def format_scores(scores: list[TemplateScore]) -> str:
    width = max(len(s.template) for s in scores)
    lines = [f"  {s.template:<{width}}  {s.correct:>5}/{s.total:<5} {s.accuracy:6.1%}" for s in scores]
    total, correct = sum(s.total for s in scores), sum(s.correct for s in scores)
    lines.append(f"  {'all':<{width}}  {correct:>5}/{total:<5} {correct / max(total, 1):6.1%}")
    return "\n".join(lines)


# ---- the whole job ------------------------------------------------------------------------------
def make_pairs(templates: TemplateSet, tasks: list[str], config: PairConfig, tokenizer=None, model=None,
               keep_correct: bool = False, batch_size: int = 32, log=print) -> list[Pair]:
    """Generate config.n candidates per task; with keep_correct, keep only those `model` gets right.

    Raises NothingCorrect (with the per-template accuracy) when the model gets none right.
    """
    tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    gen = Generator(templates, tokenizer, config)
    kept, all_scores = [], []
    for task in tasks:
        t0 = time.perf_counter()
        log(f"{task}: generating {config.n} candidates")
        gen.rejected.clear()
        candidates = gen.task(task, log=log)
        if not keep_correct:
            kept.extend(c.pair for c in candidates)
            continue
        ok = predict_correct(model, candidates, batch_size, desc=task)
        scores = score_table(candidates, ok)
        all_scores.extend(scores)
        log(f"{task}: accuracy per template ({time.perf_counter() - t0:.0f} s)\n{format_scores(scores)}")
        if not any(ok):
            log(f"{task}: the model got nothing right; no {task} pairs")
        kept.extend(c.pair for c, good in zip(candidates, ok) if good)
    if keep_correct and not kept:
        raise NothingCorrect("the model predicted no prompt correctly, so there is nothing to keep "
                             f"(try --few-shot 3):\n{format_scores(all_scores)}")
    return kept

"""Prompt templates and word pools, loaded from YAML.

A template is one line of text with slots in braces (braces mean nothing else):

    {A}, {B}      the operands, once each
    {C}           the answer; it ends the text, and the prompt is everything before it
    {OP:word}     the operator, exactly once. The reference shows `word`; the counterfactual shows
                  a random NONSENSE pool word if `word` is alphabetic, else a random SYMBOLS symbol
    {NAME}        a filler from the pool NAME, the same value at every occurrence. NAME2, NAME3...
                  draw from the NAME pool and differ from NAME
    {OBJECT~}     like {OBJECT} in the reference; in the counterfactual this occurrence gets another
                  value of the pool (figure 9 of the paper: "... gains 4 cups. What is the total
                  number of tables that John has?")

A YAML file holds `templates:` (a list) and/or `pools:` (a mapping). Template fields:

    id          unique name, e.g. add-eq-1
    task        addition, subtraction, multiplication, division or exponentiation
    text        as above
    slots       optional {slot: pool}, e.g. {VERB: SPAN_PAST}, for a slot named unlike its pool
    max_answer  optional upper bound on the answer, e.g. 9 when it is the last digit of a year
    answer      optional: the filler slot whose value is the answer, for tasks beyond arithmetic

A template with `answer:` names its own task (e.g. ioi) and has no {A}, {B} or {OP}: {C} is the value of
the named slot, and the counterfactual changes the occurrences marked ~ (at least one). A ~ occurrence
always gets a value that no slot of the sample holds in its pool: a third name in indirect-object
identification (Wang et al. 2022), whose template reads

    text: "When {IO} and {S} went to the {PLACE}, {S~} gave a {GIFT} to {C}"
    slots: {IO: NAME, S: NAME}
    answer: IO

("When Paul and Laura went to the school, Laura gave a gift to" -> Paul; the counterfactual has another
name where Laura gives).

A pool is a list of strings or {range: [lo, hi]} (integers, both ends included).
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import TemplateError
from ..io import read_yaml

TASKS = ("addition", "subtraction", "multiplication", "division", "exponentiation")
OPERANDS = ("A", "B")
ANSWER = "C"
NONSENSE, SYMBOLS = "NONSENSE", "SYMBOLS"  # the pools operator replacements come from

_SLOT = re.compile(r"\{([^{}]*)\}")
_SLOT_BODY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(~?)(?::(.*))?$", re.S)
_NUMBERED = re.compile(r"^(.*?[A-Za-z_])(\d+)$")
_TASK_NAME = re.compile(r"[a-z][a-z0-9-]*")




@dataclass(frozen=True)
class Slot:
    """One {...} in a template text."""

    name: str            # A, B, C, OP or a filler slot such as NAME2
    resample: bool = False  # `~`: the counterfactual draws another value here
    word: str | None = None  # OP only: the operator as the reference shows it


@dataclass(frozen=True)
class Template:
    """A parsed, validated template. `parts` alternates literal strings and Slots."""

    id: str
    task: str
    text: str
    parts: tuple = ()
    pool_of: dict = field(default_factory=dict)  # filler slot -> pool name
    max_answer: int | None = None
    source: str = ""  # the file it came from, for messages
    answer: str | None = None  # the filler slot whose value is the answer; None: computed from A and B

    @property
    def operator(self) -> Slot:
        return next(p for p in self.parts if isinstance(p, Slot) and p.name == "OP")

    @property
    def fillers(self) -> list[str]:
        """Filler slot names in order of first appearance."""
        seen = []
        for p in self.parts:
            if isinstance(p, Slot) and p.name in self.pool_of and p.name not in seen:
                seen.append(p.name)
        return seen


@dataclass
class TemplateSet:
    """Templates plus the pools their slots draw from."""

    templates: list[Template]
    pools: dict[str, list[str]]

    def for_task(self, task: str) -> list[Template]:
        return [t for t in self.templates if t.task == task]

    @property
    def tasks(self) -> list[str]:
        """The arithmetic tasks in TASKS' order, then the tasks of answer-slot templates as they come."""
        own = [t.task for t in self.templates if t.task not in TASKS]
        return [t for t in TASKS if self.for_task(t)] + list(dict.fromkeys(own))

    def get(self, template_id: str) -> Template:
        for t in self.templates:
            if t.id == template_id:
                return t
        raise TemplateError(f"no template {template_id!r}; known: {', '.join(t.id for t in self.templates)}")


# ---- parsing ------------------------------------------------------------------------------------
def parse_text(template_id: str, text: str) -> tuple:
    """Split a template text into literal strings and Slots; errors name the template."""
    parts: list[str | Slot] = []
    pos = 0
    for m in _SLOT.finditer(text):
        if m.start() > pos:
            parts.append(text[pos:m.start()])
        body = _SLOT_BODY.match(m.group(1).strip())
        if not body:
            raise TemplateError(f"template {template_id}: malformed slot {m.group(0)!r}")
        name, tilde, word = body.group(1), bool(body.group(2)), body.group(3)
        if (name == "OP") != (word is not None):
            raise TemplateError(f"template {template_id}: slot {m.group(0)!r}: only OP takes a word, "
                                "and OP needs one, e.g. {OP:plus}")
        if name == "OP" and not word.strip():
            raise TemplateError(f"template {template_id}: slot {m.group(0)!r}: the operator word is empty")
        if tilde and name in (*OPERANDS, ANSWER, "OP"):
            raise TemplateError(f"template {template_id}: slot {m.group(0)!r}: ~ is for filler slots only")
        parts.append(Slot(name, tilde, word))
        pos = m.end()
    if pos < len(text):
        parts.append(text[pos:])
    stray = [c for p in parts if isinstance(p, str) for c in "{}" if c in p]
    if stray:
        raise TemplateError(f"template {template_id}: unmatched {stray[0]!r} in {text!r}")
    return tuple(parts)


@dataclass(frozen=True)
class TemplateEntry:
    """One entry of a YAML file's `templates:` as written, each field still to be checked (absent: None)."""
    id: Any = None
    task: Any = None
    text: Any = None
    slots: Any = None
    max_answer: Any = None
    answer: Any = None


@dataclass(frozen=True)
class TemplateFile:
    """A template file as written: its `templates:` and `pools:`, each still to be checked."""
    templates: Any = field(default_factory=list)
    pools: Any = field(default_factory=dict)


def build_template(raw: dict, pools: dict, source: str = "") -> Template:
    """Validate one YAML entry against the pools."""
    where = f" ({source})" if source else ""
    if not isinstance(raw, dict):
        raise TemplateError(f"template entry{where} must be a mapping, got {raw!r}")
    known = {f.name for f in fields(TemplateEntry)}
    entry = TemplateEntry(**{k: v for k, v in raw.items() if k in known})
    tid = entry.id
    if not isinstance(tid, str) or not tid:
        raise TemplateError(f"template entry{where} without an id: {raw!r}")
    unknown = set(raw) - known
    if unknown:
        raise TemplateError(f"template {tid}{where}: unknown field(s) {', '.join(sorted(unknown))}")
    task, text, answer = entry.task, entry.text, entry.answer
    if answer is None and task not in TASKS:
        raise TemplateError(f"template {tid}{where}: task {task!r} is not one of {', '.join(TASKS)} (a task "
                            "beyond arithmetic names the slot that holds its answer: `answer: NAME`)")
    if answer is not None and (not isinstance(task, str) or not _TASK_NAME.fullmatch(task) or task in TASKS):
        raise TemplateError(f"template {tid}{where}: a template with `answer:` names a task of its own in lower "
                            f"case letters, digits and - (e.g. ioi), not {task!r}"
                            + (f": {task} computes its answer from {{A}} and {{B}}" if task in TASKS else ""))
    if not isinstance(text, str) or not text.strip():
        raise TemplateError(f"template {tid}{where}: needs a text")
    parts = parse_text(tid, text)
    slots = [p for p in parts if isinstance(p, Slot)]
    names = [s.name for s in slots]
    if answer is not None:
        _check_answer_slot(tid, where, text, answer, slots, raw)
    for required in (*OPERANDS, "OP", ANSWER) if answer is None else (ANSWER,):
        if names.count(required) == 0:
            raise TemplateError(f"template {tid}{where}: missing slot {{{required}}} in {text!r}")
        if names.count(required) > 1:
            raise TemplateError(f"template {tid}{where}: slot {{{required}}} appears {names.count(required)} times")
    if parts[-1] != Slot(ANSWER):
        raise TemplateError(f"template {tid}{where}: slot {{C}} must end the text (the prompt is what precedes it)")

    mapping = entry.slots or {}
    if not isinstance(mapping, dict):
        raise TemplateError(f"template {tid}{where}: slots must map slot names to pool names")
    pool_of = {}
    for name in names:
        if name in (*OPERANDS, ANSWER, "OP") or name in pool_of:
            continue
        numbered = _NUMBERED.match(name)
        pool = mapping.get(name) or (name if name in pools else None) or \
            (numbered.group(1) if numbered and numbered.group(1) in pools else None)
        if pool not in pools:
            raise TemplateError(f"template {tid}{where}: unknown slot {{{name}}} (no pool {pool or name!r}; "
                                f"pools: {', '.join(sorted(pools))})")
        pool_of[name] = pool
    for name in mapping:
        if name not in pool_of:
            raise TemplateError(f"template {tid}{where}: slots maps {name!r}, which the text does not use")
    if answer is None:
        pool_of_op = NONSENSE if _is_word(next(s.word for s in slots if s.name == "OP")) else SYMBOLS
        if pool_of_op not in pools or not pools[pool_of_op]:
            raise TemplateError(f"template {tid}{where}: slot {{OP}} needs the pool {pool_of_op}")

    max_answer = entry.max_answer
    if max_answer is not None and (not isinstance(max_answer, int) or isinstance(max_answer, bool)):
        raise TemplateError(f"template {tid}{where}: max_answer must be an integer")
    return Template(tid, str(task), text, parts, pool_of, max_answer, source, answer)


def _check_answer_slot(tid: str, where: str, text: str, answer, slots: list[Slot], raw: dict) -> None:
    """What a template whose answer is a slot's value needs: that slot in the text, a ~ occurrence for the
    counterfactual to change, and none of arithmetic's slots."""
    if not isinstance(answer, str) or not _SLOT_BODY.fullmatch(answer) or ":" in answer or "~" in answer:
        raise TemplateError(f"template {tid}{where}: answer must name a slot of the text, e.g. `answer: IO`, "
                            f"not {answer!r}")
    names = [s.name for s in slots]
    arithmetic = [n for n in (*OPERANDS, "OP") if n in names]
    if arithmetic:
        raise TemplateError(f"template {tid}{where}: slot {{{arithmetic[0]}}} is arithmetic's; a template with "
                            "`answer:` takes its answer from a slot and its counterfactual from the ~ slots")
    if answer == ANSWER:
        raise TemplateError(f"template {tid}{where}: answer names the slot whose value {{C}} shows, e.g. "
                            "`answer: IO`, not C itself")
    if answer not in names:
        raise TemplateError(f"template {tid}{where}: answer slot {{{answer}}} is not in the text {text!r}: "
                            "the prompt must show the value the answer repeats")
    if not any(s.resample for s in slots):
        raise TemplateError(f"template {tid}{where}: no slot marked ~, so the counterfactual would equal the "
                            "reference; mark the occurrences it changes, e.g. {S~}")
    if raw.get("max_answer") is not None:
        raise TemplateError(f"template {tid}{where}: max_answer bounds a computed answer; a slot's answer has "
                            "none")


def _is_word(word: str | None) -> bool:
    return word is not None and any(c.isalpha() for c in word)


def operator_pool(template: Template) -> str:
    return NONSENSE if _is_word(template.operator.word) else SYMBOLS


def _read_pools(raw, source: str) -> dict[str, list[str]]:
    if not isinstance(raw, dict):
        raise TemplateError(f"{source}: pools must be a mapping of name -> list")
    pools = {}
    for name, value in raw.items():
        if isinstance(value, dict) and set(value) == {"range"}:
            lo, hi = value["range"]
            values = [str(v) for v in range(int(lo), int(hi) + 1)]
        elif isinstance(value, list):
            # YAML reads an unquoted null, yes or no as None/True/False: quoting is needed there
            odd = [v for v in value if v is None or isinstance(v, bool) or not isinstance(v, (str, int))]
            if odd:
                raise TemplateError(f"{source}: pool {name}: entry {odd[0]!r} is not a string (quote it)")
            values = [str(v) for v in value]
        else:
            raise TemplateError(f"{source}: pool {name} must be a list or {{range: [lo, hi]}}")
        if not values:
            raise TemplateError(f"{source}: pool {name} is empty")
        pools[str(name)] = values
    return pools


# ---- loading ------------------------------------------------------------------------------------
def builtin_files() -> list[Path]:
    folder = resources.files("keyheads.data") / "templates"
    return sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_templates(files: Iterable[str | Path] | None = None) -> TemplateSet:
    """Templates from `files` (None or the word "builtin" means the built-in ones).

    The built-in pools are always available; pools in `files` add to or replace them by name.
    """
    files = ["builtin"] if files is None else list(files)
    paths: list[Path] = []
    for f in files:
        paths.extend(builtin_files() if str(f) == "builtin" else [Path(f)])
    docs = [(str(p), _load_yaml(p)) for p in builtin_files()]
    chosen = [(str(p), _load_yaml(p)) for p in paths]
    builtin = {str(p) for p in builtin_files()}
    pools: dict[str, list[str]] = {}
    for source, doc in docs + [(source, doc) for source, doc in chosen if source not in builtin]:  # built-in first
        pools.update(_read_pools(doc.pools, source))
    templates: list[Template] = []
    seen: dict[str, str] = {}  # template id -> the file that defines it
    for source, doc in chosen:
        raw = doc.templates
        if not isinstance(raw, list):
            raise TemplateError(f"{source}: templates must be a list")
        for entry in raw:
            t = build_template(entry, pools, source)
            if t.id in seen:
                raise TemplateError(f"template {t.id} is defined twice ({seen[t.id]} and {source})")
            seen[t.id] = source
            templates.append(t)
    if not templates:
        raise TemplateError(f"no templates in {', '.join(str(p) for p in paths)}")
    return TemplateSet(templates, pools)


def _load_yaml(path: Path) -> TemplateFile:
    doc = read_yaml(path, "template file") or {}
    if not isinstance(doc, dict) or set(doc) - {"templates", "pools"}:
        raise TemplateError(f"{path}: expected a mapping with `templates:` and/or `pools:`")
    return TemplateFile(**doc)

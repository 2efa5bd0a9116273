"""The settings of the data step: how `keyheads data` and a run's `data:` section generate pairs (PairSettings),
and the template ids it may name. Generating is in generate.py; the settings load without torch, so that
keyheads.config.run and keyheads.config.commands validate a config without a model library."""
from __future__ import annotations

from pydantic import Field, field_validator

from ..errors import SettingError
from ..section import Section
from .templates import TASKS, load_templates

# the pairs made of GSM8K's test questions (appendix E; keyheads.data.wordproblems): their task and template name,
# and an entry of a run's also_identify beside the tasks
WORD_PROBLEMS = "gsm8k"

ALL = "all"  # every task of the loaded templates


class PairSettings(Section):
    """How pairs are generated. Everything is deterministic given the seed; each template has its own
    random stream, so adding a template or a task does not change the others' pairs. The fields and
    descriptions are also flags of `keyheads data` and keys of a run's `data:` section."""

    n: int = Field(default=100, ge=1, description="candidate pairs per task, spread evenly over its templates, before "
                                          "keeping the correct ones")
    few_shot: int = Field(default=0, ge=0, description="solved examples of the same template before each prompt, one a "
                                               "line; reference and counterfactual share them")
    shared_prefix: bool = Field(
        default=False, description="draw the few-shot examples once per template, so that every "
        "prompt of a template starts with the same text and analyses compute it once (a "
        "question that repeats one of the examples is rejected)")
    seed: int = Field(default=0, ge=0, description="picks operands, pool words and few-shot examples")
    a_range: tuple[int, int] = Field(
        default=(1, 9), description="operand A's range, both ends included (the paper: 1..9)",
        json_schema_extra={"metavar": "LO,HI"})
    b_range: tuple[int, int] = Field(default=(1, 9), description="operand B's range, both ends included",
                                     json_schema_extra={"metavar": "LO,HI"})
    allow_negative: bool = Field(default=False, description="subtraction may have a negative answer")
    allow_fractions: bool = Field(
        default=False, description="division may have a non-integer answer (up to two decimals)")
    single_token_operands: bool = Field(
        default=True, description="reject operands that span several tokens (the paper's "
        "setting; turn off for multi-digit operands with digit-splitting tokenizers; "
        "positions then point at the last token)")
    single_token_answer: bool = Field(default=False, description="reject answers of more than one token ('12' with a "
                                      "digit-splitting tokenizer); by default the first token counts, as in the paper")
    counterfactual_tries: int = Field(
        default=50, ge=1, description="counterfactual draws per sample before giving up on "
        "alignment")
    # before `task`, whose validator reads it: the template files' own tasks are valid too
    template_files: list[str] = Field(default_factory=list, description="YAML template files to use instead of "
                                      "the built-in ones; the word 'builtin' adds the built-in ones")
    task: str = Field(default="addition", description=f"one of {', '.join(TASKS)} or a task of the "
                                                    "template_files, several with commas (addition,division), "
                                                    "or all (every template's task)")
    templates: list[str] = Field(default_factory=list, description="template ids to use, e.g. add-eq-1,add-eq-2 "
                                                                   "(empty: all of the task's)")
    keep_correct: bool = Field(
        default=False, description="keep only the pairs whose answer the model predicts (argmax)")

    @field_validator("template_files")
    @classmethod
    def _template_files(cls, v):
        if v:
            load_templates(v)  # a missing file or a bad template is named now, before any model loads
        return v

    @field_validator("task")
    @classmethod
    def _task(cls, v, info):
        files = info.data["template_files"] if "template_files" in info.data else None  # None: they were bad
        return v if v == ALL else ",".join(parse_tasks(v, load_templates(files).tasks if files else TASKS))

    @property
    def arithmetic(self) -> bool:
        """Whether every task is arithmetic, so that every pair has operands and an operator (the attention
        and MLP analyses read them); a task of answer-slot templates has neither."""
        tasks = load_templates(self.template_files or None).tasks if self.task == ALL else self.task.split(",")
        return all(t in TASKS for t in tasks)

    @field_validator("a_range", "b_range")
    @classmethod
    def _range(cls, v, info):
        lo, hi = v
        if lo < 0 or hi < lo:
            raise SettingError(info.field_name, f"{lo},{hi}", "needs 0 <= LO <= HI, as in 1,9")
        return v


def parse_tasks(text: str, known=TASKS) -> list[str]:
    """"addition, division" -> ["addition", "division"]: the tasks a `task` setting names, each one of `known`
    (the arithmetic ones, or the tasks of the templates loaded; "all" is not a list: it takes the tasks of
    whichever templates are loaded). A SettingError names a task that is not one."""
    tasks = [t.strip() for t in text.split(",")]
    valid = f"valid tasks: {', '.join(known)}, several with commas, or {ALL} alone"
    bad = [t for t in tasks if t not in known]
    if bad:
        raise SettingError("task", text, f"unknown task {', '.join(map(repr, bad))}; {valid}")
    if len(set(tasks)) != len(tasks):
        raise SettingError("task", text, f"a task is named twice; {valid}")
    return tasks


def check_template_ids(ids: list[str], files=None, key: str = "templates") -> list[str]:
    """The template ids, each a template of `files` (None: the built-in ones); a SettingError names the others."""
    known = {t.id for t in load_templates(files).templates}
    unknown = [t for t in ids if t not in known]
    if unknown:
        raise SettingError(key, unknown, f"unknown template id(s) {', '.join(unknown)}; the built-in ones "
                                         "are in keyheads/data/templates/*.yaml")
    return ids

"""The six table-1 benchmarks and the generated arith sets as tasks, and `make_task` for every
benchmark name (generic-kl is in drift.py, the task types in task_types.py)."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ..data.benchmarks import LETTERS, Record, get_benchmark, load
from ..data.trainset import heldout_splits
from ..errors import SettingError
from ..models.model import HookedModel
from .arith import ArithItem, arith_items, arith_prompt
from .drift import DriftTask
from .engine import generate_stream, next_token_logits
from .extract import extract_answer, extract_first, numbers_match
from .mmlu_subjects import subjects_of
from .prompts import STOPS, choice_prompt, cut_at_stop, letter_tokens, math_prompt, pick, pick_balanced, round_robin
from .settings import (
    ARITH,
    DRIFT,
    MATH,
    EvalSettings,
    check_benchmarks,
)
from .task_types import Item, Task

__all__ = ["ArithTask", "ChoiceTask", "MathTask", "make_task"]  # the names of the benchmarks live in .config

def prompt_ids(model: HookedModel, prompts: Sequence[str]) -> list[list[int]]:
    return [model.tokenizer(p)["input_ids"] for p in prompts]


class MathTask(Task):
    stops: tuple[str, ...] = STOPS
    continuous = True  # generation: rows end at different steps, and finished ones make room

    def __init__(self, name: str, cfg: EvalSettings, data_dir: str | None = None):
        self.name = name
        records = load(name, data_dir=data_dir)
        self.split = get_benchmark(name).evaluated
        if cfg.split == "heldout" and name != "gsm8k":
            records = heldout_splits(data_dir, cfg.heldout)[name][1]
            self.split = f"heldout-{cfg.heldout.tag()}"
        self.exemplars = pick(load("gsm8k", "train", data_dir=data_dir), cfg.shots(name), cfg.seed)
        self.cot = cfg.cot
        records = records[:cfg.limit] if cfg.limit is not None else records
        self.items = [Item(r, math_prompt(r.question, self.exemplars, cfg.cot)) for r in records]

    def settings(self, tokenizer, cfg):
        return {"type": "greedy", "v": 1, "stops": list(self.stops) + ["answer-complete"],
                "max_new_tokens": cfg.new_tokens(self.name)}

    def run(self, model, items, prefix, cfg, batch_size):
        rows = prompt_ids(model, [it.prompt for it in items])
        budget = cfg.new_tokens(self.name)
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit and max(map(len, rows)) + budget > limit:
            raise SettingError(f"{self.name}: prompt ({max(map(len, rows))} tokens) + {budget} new tokens "
                               f"exceed the model's context of {limit}; use fewer shots or --max-new-tokens")
        outs = generate_stream(model, rows, budget, lambda text: cut_at_stop(text, self.stops), prefix,
                               batch_size=batch_size)
        return ((j, {"id": items[j].record.id, "output": text, "finish": finish}) for j, (text, finish) in outs)

    def extract(self, text: str) -> tuple[float | None, str | None, str]:
        return extract_answer(text)

    def score(self, item, row):
        """Extraction runs on the cached text, so a better extractor needs no new generation."""
        value, found, how = self.extract(row["output"])
        return {**row, "gold": item.record.answer, "pred": value, "pred_text": found, "how": how,
                "correct": numbers_match(value, item.record.answer, found)}

    def summarize(self, items, rows):
        out = super().summarize(items, rows)
        out["cot"] = self.cot
        out["no_number"] = sum(r["how"] == "none" for r in rows)
        out["hit_length_limit"] = sum(r["finish"] == "length" for r in rows)
        return out

    def wrong_case(self, item, row):
        return {"id": item.record.id, "question": item.record.question, "gold": row["gold"],
                "pred": row["pred"], "how": row["how"], "finish": row["finish"], "output": row["output"]}


class ArithTask(MathTask):
    """A generated arith set (keyheads.evaluation.arith): the answer is a bare number on the prompt's
    line, so generation stops at the newline and the first number is the prediction."""

    stops = ("\n",)

    def __init__(self, name: str, cfg: EvalSettings, data_dir: str | None = None):  # generated: no data folder
        self.name, self.split, self.cot = name, "generated", False
        test, pool = arith_items(name)
        shots = pick(pool, cfg.shots(name), cfg.seed)
        self.exemplars = [self.record(e) for e in shots]
        test = test[:cfg.limit] if cfg.limit is not None else test
        self.items = [Item(self.record(t), arith_prompt(t.question, shots)) for t in test]

    def record(self, item: ArithItem) -> Record:
        return Record(item.id, item.question, f"{self.name}/{self.split}", answer=float(item.answer))

    def extract(self, text):
        return extract_first(text)


class ChoiceTask(Task):
    def __init__(self, name: str, cfg: EvalSettings, data_dir: str | None = None):
        self.name = name
        mmlu = name.startswith("mmlu")  # mmlu, or one category of it (mmlu-humanities, ...)
        self.split = get_benchmark("mmlu" if mmlu else name).evaluated
        records = load("mmlu" if mmlu else name, data_dir=data_dir)
        if mmlu and name != "mmlu":
            subjects = subjects_of(name)
            records = [r for r in records if r.subject in subjects]
            if not records:
                raise SettingError(f"{name}: the MMLU test set in the data folder has no question of its subjects "
                                   f"({', '.join(sorted(subjects))})")
        k = cfg.shots(name)
        if mmlu:
            dev: defaultdict[str | None, list[Record]] = defaultdict(list)  # a subject's 5-shot pool, in file order
            for r in load("mmlu", "dev", data_dir=data_dir):
                dev[r.subject].append(r)
            shots = {s: rs[:k] for s, rs in dev.items()}
            self.exemplars = dev[records[0].subject][:k] if records else []
            records = round_robin(records)
        else:
            pool = pick_balanced(load(name, "train", data_dir=data_dir), k, cfg.seed)
            shots, self.exemplars = None, pool
        records = records[:cfg.limit] if cfg.limit is not None else records
        self.n_choices = max(len(r.choices) for r in records) if records else 4
        self.items = [Item(r, choice_prompt(r, shots[r.subject] if shots else self.exemplars)) for r in records]

    @property
    def cache_name(self) -> str:
        """An MMLU category's items are MMLU's, with the same prompts: scored once for both."""
        return "mmlu" if self.name.startswith("mmlu") else self.name

    def settings(self, tokenizer, cfg):
        lt = letter_tokens(tokenizer, self.n_choices)
        return {"type": "letters", "v": 1, "extra": list(lt.extra), "letters": list(lt.letters)}

    def run(self, model, items, prefix, cfg, batch_size):
        lt = letter_tokens(model.tokenizer, self.n_choices)
        rows = [ids + list(lt.extra) for ids in prompt_ids(model, [it.prompt for it in items])]
        logits = next_token_logits(model, rows, prefix)
        return enumerate([
            {"id": it.record.id, "scores": [float(x) for x in row_logits[list(lt.letters[: len(it.record.choices)])]]}
            for it, row_logits in zip(items, logits)
        ])

    def score(self, item, row):
        pred = max(range(len(row["scores"])), key=row["scores"].__getitem__)
        return {**row, "subject": item.record.subject, "label": item.record.label, "pred": pred,
                "correct": pred == item.record.label}

    def summarize(self, items, rows):
        out = super().summarize(items, rows)
        if self.name.startswith("mmlu"):
            out["exemplars"] = "the first k dev questions of each subject"
            subjects: dict[str, list[int]] = {}
            for r in rows:
                subjects.setdefault(r["subject"], []).append(int(r["correct"]))
            out["subjects"] = {s: {"n": len(v), "correct": sum(v), "accuracy": sum(v) / len(v)}
                               for s, v in sorted(subjects.items())}
            out["macro_accuracy"] = sum(s["accuracy"] for s in out["subjects"].values()) / max(len(subjects), 1)
        return out

    def wrong_case(self, item, row):
        return {"id": item.record.id, "subject": item.record.subject, "question": item.record.question,
                "choices": list(item.record.choices), "gold": LETTERS[row["label"]], "pred": LETTERS[row["pred"]],
                "scores": row["scores"]}


def make_task(name: str, cfg: EvalSettings, data_dir: str | None = None) -> Task:
    """The benchmark `name` under `cfg`; its items are read from `data_dir` (None: $KEYHEADS_DATA, else the hub)."""
    check_benchmarks([name])
    if name in ARITH:
        return ArithTask(name, cfg)
    if name == DRIFT:
        return DriftTask(cfg, data_dir)
    return MathTask(name, cfg, data_dir) if name in MATH else ChoiceTask(name, cfg, data_dir)

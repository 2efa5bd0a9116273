"""The six table-1 benchmarks and the generated arith sets as tasks: items with prompts, how a batch
is run, how it is scored."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Sequence

from pydantic import ConfigDict, Field, field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from ..data.benchmarks import LETTERS, Record, get_benchmark, load
from ..data.trainset import SplitConfig, heldout_splits
from ..models.model import HookedModel
from .arith import ARITH_SETS, ArithItem, arith_items, arith_prompt
from .engine import PrefixKV, greedy_generate, next_token_logits
from .extract import extract_answer, extract_first, numbers_match, wilson
from .prompts import STOPS, choice_prompt, cut_at_stop, letter_tokens, math_prompt, pick, pick_balanced

MATH = ("gsm8k", "addsub", "singleeq", "svamp")
CHOICE = ("mmlu", "csqa")
TABLE_BENCHMARKS = MATH + CHOICE
ARITH = tuple(ARITH_SETS)  # generated, held out from `--train arith:...`; need no data folder
DRIFT = ("generic-kl",)  # KL from the reference row and perplexity on MMLU/CSQA question texts
BENCHMARKS = TABLE_BENCHMARKS + ARITH + DRIFT
DEFAULT_SHOTS = {"gsm8k": 4, "addsub": 4, "singleeq": 4, "svamp": 4, "mmlu": 5, "csqa": 5,
                 **{name: 4 for name in ARITH}}
# GSM8K needs several reasoning steps; the other three are one or two operations. An arith answer is
# one number of at most six characters, then the newline that ends it: 8 tokens even digit by digit.
DEFAULT_NEW_TOKENS = {"gsm8k": 256, "addsub": 128, "singleeq": 128, "svamp": 128, **{name: 8 for name in ARITH}}


@pydantic_dataclass(config=ConfigDict(extra="forbid"))
class EvalConfig:
    """Settings of an evaluation run; the fields and descriptions are also flags of `keyheads eval`
    and keys of a run's `eval:` section (keyheads.config)."""

    benchmarks: tuple[str, ...] = Field(TABLE_BENCHMARKS, description="benchmarks of the table, in its order; "
                                        "arith-* sets are generated, the others read data_dir")
    data_dir: Optional[str] = Field(None, description="the benchmarks folder (default $KEYHEADS_DATA, else the hub "
                                                      "when online)")
    limit: Optional[int] = Field(None, ge=1, description="only the first N items of each benchmark (MMLU: "
                                 "round-robin over subjects, so a small N still covers many; None: all)")
    batch_size: int = Field(16, ge=1, description="prompts per forward pass")
    max_new_tokens: Optional[int] = Field(None, ge=1, description="generation budget for the math and arith sets "
                                          "(None: 256 for GSM8K, 128 for the other math sets, 8 for arith-*)")
    few_shot: Optional[int] = Field(None, ge=0, description="exemplars per prompt (None: 4 for math and arith, 5 "
                                                            "for MMLU/CSQA; MMLU has at most 5 per subject)")
    cot: bool = Field(True, description="math exemplars show the GSM8K rationale before 'The answer is N.'")
    seed: int = Field(0, ge=0, description="picks the GSM8K-train, CSQA-train and arith exemplars")
    split: Literal["full", "heldout"] = Field(
        "full", description="full (the whole test sets, as in the paper) or heldout (for AddSub, SingleEq and SVAMP "
        "only the part the training-set builder leaves out; the arith sets are held out either way)")
    heldout: SplitConfig = Field(default_factory=SplitConfig, description="the held-out split's seed and train "
                                                                          "fraction (must match the training set's)")
    cache_dir: Optional[str] = Field(None, description="per-item result cache, shared by runs (entries are keyed "
                                     "by model fingerprint, prompt and settings; None: $KEYHEADS_CACHE/eval)")
    progress: bool = Field(True, description="progress bars")
    shard: Optional[tuple[int, int]] = Field(None, description="(k, n): compute only the items in shard k of n, so "
                                             "that n processes sharing one cache split an evaluation; such a run "
                                             "writes no table")

    @field_validator("benchmarks")
    @classmethod
    def _benchmarks(cls, v):
        return check_benchmarks(v)

    @field_validator("shard")
    @classmethod
    def _shard(cls, v):
        if v is not None:
            k, n = v
            if not (n >= 1 and 0 <= k < n):
                raise ValueError(f"shard {k}/{n} is not valid: use K/N with 0 <= K < N, e.g. 0/2 and 1/2")
        return v

    def shots(self, bench: str) -> int:
        k = DEFAULT_SHOTS[bench] if self.few_shot is None else self.few_shot
        return min(k, 5) if bench == "mmlu" else k

    def new_tokens(self, bench: str) -> int:
        return DEFAULT_NEW_TOKENS[bench] if self.max_new_tokens is None else self.max_new_tokens


def check_benchmarks(names: Sequence[str]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark {', '.join(map(repr, unknown))}; known: {', '.join(BENCHMARKS)}")
    return tuple(names)


@dataclass
class Item:
    record: Record
    prompt: str


class Task:
    """One benchmark: `items` builds the prompts, `run` scores a batch, `summarize` aggregates."""

    name: str
    split: str
    exemplars: list[Record]

    def group(self, item: Item) -> str:
        """Items of one group share a few-shot prefix; batches do not mix groups."""
        return item.record.subject or ""

    def settings(self, model: HookedModel, cfg: EvalConfig) -> dict:
        """Everything besides model and prompt that changes the raw result (part of the cache key)."""
        raise NotImplementedError

    def run(self, model: HookedModel, items: Sequence[Item], prefix: PrefixKV, cfg: EvalConfig) -> list[dict]:
        """Raw results to cache (generated text, letter logits)."""
        raise NotImplementedError

    def score(self, item: Item, row: dict) -> dict:
        """The cached row plus prediction and correctness."""
        raise NotImplementedError

    def summarize(self, items: Sequence[Item], rows: Sequence[dict]) -> dict:
        n, correct = len(rows), sum(bool(r["correct"]) for r in rows)
        lo, hi = wilson(correct, n)
        return {"benchmark": self.name, "split": self.split, "n": n, "correct": correct,
                "accuracy": correct / n if n else 0.0, "ci95": [lo, hi], "few_shot": len(self.exemplars),
                "exemplars": [e.id for e in self.exemplars]}

    def wrong_case(self, item: Item, row: dict) -> dict:
        raise NotImplementedError


def _ids(model: HookedModel, prompts: Sequence[str]) -> list[list[int]]:
    return [model.tokenizer(p)["input_ids"] for p in prompts]


class MathTask(Task):
    stops = STOPS

    def __init__(self, name: str, cfg: EvalConfig):
        self.name = name
        records = load(name, data_dir=cfg.data_dir)
        self.split = get_benchmark(name).evaluated
        if cfg.split == "heldout" and name != "gsm8k":
            records = heldout_splits(cfg.data_dir, cfg.heldout)[name][1]
            self.split = f"heldout-{cfg.heldout.tag()}"
        self.exemplars = pick(load("gsm8k", "train", data_dir=cfg.data_dir), cfg.shots(name), cfg.seed)
        self.cot = cfg.cot
        records = records[:cfg.limit] if cfg.limit is not None else records
        self.items = [Item(r, math_prompt(r.question, self.exemplars, cfg.cot)) for r in records]

    def settings(self, model, cfg):
        return {"type": "greedy", "v": 1, "stops": list(self.stops) + ["answer-complete"],
                "max_new_tokens": cfg.new_tokens(self.name)}

    def run(self, model, items, prefix, cfg):
        rows = _ids(model, [it.prompt for it in items])
        budget = cfg.new_tokens(self.name)
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit and max(map(len, rows)) + budget > limit:
            raise ValueError(f"{self.name}: prompt ({max(map(len, rows))} tokens) + {budget} new tokens "
                             f"exceed the model's context of {limit}; use fewer shots or --max-new-tokens")
        outs = greedy_generate(model, rows, budget, lambda text: cut_at_stop(text, self.stops), prefix)
        return [{"id": it.record.id, "output": text, "finish": finish} for it, (text, finish) in zip(items, outs)]

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

    def __init__(self, name: str, cfg: EvalConfig):
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
    def __init__(self, name: str, cfg: EvalConfig):
        self.name = name
        self.split = get_benchmark(name).evaluated
        records = load(name, data_dir=cfg.data_dir)
        k = cfg.shots(name)
        if name == "mmlu":
            dev: dict[str, list[Record]] = {}
            for r in load("mmlu", "dev", data_dir=cfg.data_dir):
                dev.setdefault(r.subject, []).append(r)
            shots = {s: rs[:k] for s, rs in dev.items()}  # the dev set is the 5-shot pool, in file order
            self.exemplars = shots.get(records[0].subject, []) if records else []
            records = _round_robin(records)
        else:
            pool = pick_balanced(load(name, "train", data_dir=cfg.data_dir), k, cfg.seed)
            shots, self.exemplars = None, pool
        records = records[:cfg.limit] if cfg.limit is not None else records
        self.n_choices = max(len(r.choices) for r in records) if records else 4
        self.items = [Item(r, choice_prompt(r, shots[r.subject] if shots else self.exemplars)) for r in records]

    def settings(self, model, cfg):
        lt = letter_tokens(model.tokenizer, self.n_choices)
        return {"type": "letters", "v": 1, "extra": list(lt.extra), "letters": list(lt.letters)}

    def run(self, model, items, prefix, cfg):
        lt = letter_tokens(model.tokenizer, self.n_choices)
        rows = [ids + list(lt.extra) for ids in _ids(model, [it.prompt for it in items])]
        logits = next_token_logits(model, rows, prefix)
        return [{"id": it.record.id, "scores": [float(x) for x in row_logits[list(lt.letters[:len(it.record.choices)])]]}
                for it, row_logits in zip(items, logits)]

    def score(self, item, row):
        pred = max(range(len(row["scores"])), key=row["scores"].__getitem__)
        return {**row, "subject": item.record.subject, "label": item.record.label, "pred": pred,
                "correct": pred == item.record.label}

    def summarize(self, items, rows):
        out = super().summarize(items, rows)
        if self.name == "mmlu":
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


def _round_robin(records: list[Record]) -> list[Record]:
    """Subject by subject interleaving: question 0 of every subject, then question 1, ..."""
    by_subject: dict[str, list[Record]] = {}
    for r in records:
        by_subject.setdefault(r.subject, []).append(r)
    out, depth = [], max(len(v) for v in by_subject.values())
    for i in range(depth):
        out.extend(v[i] for v in by_subject.values() if i < len(v))
    return out


def make_task(name: str, cfg: EvalConfig) -> Task:
    check_benchmarks([name])
    if name in ARITH:
        return ArithTask(name, cfg)
    if name in DRIFT:
        from .drift import DriftTask

        return DriftTask(cfg)
    return MathTask(name, cfg) if name in MATH else ChoiceTask(name, cfg)

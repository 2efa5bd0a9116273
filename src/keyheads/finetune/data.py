"""Training examples (prompt, completion) and their token batches; the loss is on the completion only.

`--train` takes:
- a JSONL file of {"prompt", "completion"} objects;
- `trainset`: the clean math set of `keyheads.data.trainset` (GSM8K train plus the held-out parts of
  AddSub, SingleEq and SVAMP), in the evaluation's prompt and answer format;
- `arith:KINDS[:N]`: arithmetic made from the templates, KINDS from `multidigit`, `decimal`
  (comma-separated), N samples per kind (default 2000), e.g. `arith:multidigit,decimal:4000`.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.arithmetic import ARITH_KINDS, draw_exact
from ..data.benchmarks import data_dir_from
from ..data.render import draw_fillers, render
from ..data.templates import load_templates
from ..data.trainset import build_trainset
from ..errors import BadFile, UserError
from ..io import iter_jsonl
from .settings import arith_spec, check_arith_kinds, check_train


@dataclass(frozen=True)
class Example:
    prompt: str
    completion: str


def read_jsonl_examples(path: str | Path) -> list[Example]:
    out = []
    for number, row in iter_jsonl(path):
        missing = [k for k in ("prompt", "completion") if not isinstance(row.get(k), str)]
        if missing:
            raise BadFile(f"{path}:{number}: no {' or '.join(missing)} string; each line must be "
                             '{"prompt": "...", "completion": "..."} (the loss is on the completion)')
        if not row["completion"]:
            raise BadFile(f"{path}:{number}: the completion is empty; there would be nothing to learn")
        out.append(Example(row["prompt"], row["completion"]))
    return out


def trainset_examples(data_dir: str | None = None) -> list[Example]:
    rows, _ = build_trainset(data_dir_from(data_dir))
    return [Example(f"Question: {r['question']}\nAnswer:", " " + r["target"]) for r in rows]


def arithmetic_examples(kind: str, n: int, seed: int = 0, template_ids: list[str] | None = None) -> list[Example]:
    """n prompts from the builtin templates of the kind's tasks, operands of the kind, answer as completion."""
    check_arith_kinds([kind], "kind", kind)
    tasks, operands = ARITH_KINDS[kind]
    templates = load_templates()
    # templates with a max_answer (time spans, dates, clocks) only stay true for small answers:
    # "lasted 8.1 years from the year 1032.5" teaches nothing
    chosen = [t for task in tasks for t in templates.for_task(task)
              if (not template_ids or t.id in template_ids) and t.max_answer is None]
    if not chosen:
        raise UserError(f"no template of {', '.join(tasks)} among {template_ids}")
    rng = random.Random(f"{kind}-{seed}")
    out: list[Example] = []
    while len(out) < n:
        template = chosen[len(out) % len(chosen)]
        a, b, answer = draw_exact(template.task, operands, rng)
        values = {"A": a, "B": b, **draw_fillers(template, templates.pools, rng)}
        out.append(Example(render(template, values).text, answer + "\n"))
    return out


def load_examples(spec: str, data_dir: str | None = None, seed: int = 0) -> list[Example]:
    """Examples named by a --train spec (see the module docstring)."""
    check_train(spec)
    if spec == "trainset":
        examples = trainset_examples(data_dir)
    elif spec.startswith("arith:"):
        kinds, n = arith_spec(spec)
        examples = [e for kind in kinds for e in arithmetic_examples(kind, n, seed)]
    else:
        examples = read_jsonl_examples(Path(spec))
    if not examples:
        raise UserError(f"--train {spec!r} gave no training examples")
    return examples


def examples_sha256(examples: list[Example]) -> str:
    h = hashlib.sha256()
    for e in examples:
        h.update(json.dumps([e.prompt, e.completion]).encode())
    return h.hexdigest()


@dataclass
class Tokenized:
    """One example as token ids; `n_prompt` leading tokens carry no loss."""

    ids: list[int]
    n_prompt: int


def tokenize(tokenizer, examples: list[Example], max_length: int) -> list[Tokenized]:
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    out = []
    for i, e in enumerate(examples):
        p = tokenizer(e.prompt, add_special_tokens=True)["input_ids"]
        c = tokenizer(e.completion, add_special_tokens=False)["input_ids"] + eos
        if len(p) + len(c) > max_length:
            raise UserError(f"training example {i} has {len(p) + len(c)} tokens, more than max_length "
                             f"{max_length}; raise --max-length or shorten it")
        out.append(Tokenized(p + c, len(p)))
    return out


def collate(items: list[Tokenized], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Right-padded ids, mask and labels (-100 on prompt and padding)."""
    width = max(len(t.ids) for t in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    labels = torch.full((len(items), width), -100, dtype=torch.long)
    for row, t in enumerate(items):
        ids[row, :len(t.ids)] = torch.tensor(t.ids)
        mask[row, :len(t.ids)] = 1
        labels[row, t.n_prompt:len(t.ids)] = torch.tensor(t.ids[t.n_prompt:])
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def n_loss_tokens(items: list[Tokenized]) -> int:
    """Tokens that carry loss: each completion token is predicted from the position before it."""
    return sum(len(t.ids) - t.n_prompt for t in items)

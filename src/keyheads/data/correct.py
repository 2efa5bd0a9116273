"""Which prompts a model answers correctly: batched argmax next token, accuracy per template."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from ..models.prompt_set import PromptSet, group_pass


@dataclass
class TemplateScore:
    template: str
    total: int = 0
    correct: int = 0

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


def predict_next(model, prompts: list[str], batch_size: int = 32, desc: str = "predicting",
                 answers: list[int] | None = None, progress: bool = True) -> list[int]:
    """The model's argmax next token after each prompt.

    Runs END-only passes (models.prompt_set: a shared few-shot prefix is computed once per
    group of prompts). With `answers` the progress bar shows the running accuracy.
    """
    pred = [0] * len(prompts)
    right = done = 0
    with torch.inference_mode(), tqdm(total=len(prompts), desc=desc, unit="prompt", disable=not progress) as bar:
        for group in PromptSet(model, prompts, batch_size).groups:
            for i, p in zip(group.index, group_pass(model, group).argmax(-1).tolist()):
                pred[i] = p
                right += answers is not None and p == answers[i]
            done += len(group.index)  # a disabled bar does not count
            bar.update(len(group.index))
            if answers is not None:
                bar.set_postfix(acc=f"{right / done:.0%}")
    return pred


def predict_correct(model, candidates: list, batch_size: int = 32, desc: str = "checking",
                    progress: bool = True) -> list[bool]:
    """Whether the model's argmax next token after each candidate's reference is its answer token
    (candidates: objects with .pair.reference and .answer_token)."""
    answers = [c.answer_token for c in candidates]
    pred = predict_next(model, [c.pair.reference for c in candidates], batch_size, desc, answers, progress)
    return [p == a for p, a in zip(pred, answers)]


def score_table(candidates: list, ok: list[bool]) -> list[TemplateScore]:
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

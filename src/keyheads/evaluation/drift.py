"""`generic-kl`: how far a variant's next-token distributions drift from the reference model's on
non-math text.

The bundled models answer MMLU and CSQA at chance, so their accuracies cannot show a loss of
general ability. This benchmark can: over the MMLU and CommonsenseQA question texts (every
position, no answer options), the mean KL divergence KL(reference || variant) of the next-token
distributions, and the variant's perplexity on those texts. The reference is the table's first
row (the base model), so the base row reads KL 0.

Per item the cache holds sums (KL over positions, negative log-likelihood over next tokens), so
the summary is exact at any item count; 95% intervals come from a seeded bootstrap over items.

A text read at every position has no END, so a knockout row gives its heads the mean over all
positions here, whichever mean it uses for prompts (keyheads.knockout).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ..data.benchmarks import Record, load
from ..errors import SettingError
from ..knockout import away_from_end
from .prompts import round_robin
from .settings import EvalSettings
from .task_types import Item, PairwiseTask

NAME = "generic-kl"
SOURCES = ("mmlu", "csqa")


def drift_items(cfg: EvalSettings, data_dir: str | None = None) -> list[Item]:
    """The distinct question texts of MMLU (round-robin over subjects) and CSQA, alternating, first `limit`."""
    lists = [round_robin(load("mmlu", data_dir=data_dir)), load("csqa", data_dir=data_dir)]
    texts: dict[str, Record] = {}  # a text that occurs twice would only count twice
    for i in range(max(map(len, lists))):
        for rs in lists:
            if i < len(rs):
                texts.setdefault(rs[i].question.strip(), rs[i])
    items = [Item(r, text) for text, r in texts.items()]
    return items[:cfg.limit] if cfg.limit is not None else items


@torch.no_grad()
def log_probs(prepared, ids: list[int]) -> torch.Tensor:
    """Next-token log-probabilities [T, vocab] in float32 at every position of one text."""
    model = prepared.model
    x = torch.tensor([ids], device=model.device)
    with model.hooks(edit=prepared.edits), away_from_end():  # no END in a text scored at every position
        logits = model.hf(input_ids=x, use_cache=False).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


ROWS = 64  # positions per float64 block: a 152k-word vocabulary makes each [T, vocab] copy large


def item_sums(ref: torch.Tensor, var: torch.Tensor, ids: list[int]) -> dict:
    """KL(ref || var) summed over positions, and the variant's NLL of each next token."""
    kl = 0.0
    for start in range(0, len(ids), ROWS):
        # float32 sums of p (log p - log q) leave -1e-9 where KL is 0
        r, v = ref[start:start + ROWS].double(), var[start:start + ROWS].double()
        kl += float((r.exp() * (r - v)).sum())
    nll = -var[:-1].gather(-1, torch.tensor(ids[1:], device=var.device)[:, None])[:, 0].double()
    return {"kl_sum": kl, "positions": len(ids), "nll_sum": float(nll.sum()), "tokens": len(ids) - 1}


def bootstrap(values: Sequence[tuple[float, float]], stat, n: int = 1000, seed: int = 0) -> list[float]:
    """95% percentile interval of stat(sum of numerators, sum of denominators) over items resampled
    with replacement (paired: an item's numerator and denominator stay together); seeded."""
    arr = np.asarray(values, dtype=np.float64)
    if len(arr) < 2:
        return [float("nan"), float("nan")]
    from scipy import stats  # noqa: PLC0415 -- loaded on use, see pyproject

    ci = stats.bootstrap((arr[:, 0], arr[:, 1]), lambda a, b, axis: stat(a.sum(axis), b.sum(axis)), paired=True,
                         vectorized=True, n_resamples=n, method="percentile", rng=np.random.default_rng(seed))
    return [float(ci.confidence_interval.low), float(ci.confidence_interval.high)]


class DriftTask(PairwiseTask):
    """Scored against a reference variant (the runner sets `reference`), not by correctness."""

    def __init__(self, cfg: EvalSettings, data_dir: str | None = None):
        self.name, self.split, self.exemplars = NAME, "+".join(SOURCES) + " questions", []
        self.items = drift_items(cfg, data_dir)
        self.reference = None

    def group(self, item):
        return ""

    def settings(self, tokenizer, cfg):
        return {"type": "drift", "v": 2, "reference": self.the_reference().fingerprint}

    def run_pair(self, prepared, items, cfg) -> list[dict]:
        reference = self.the_reference()
        ref_tok, tok = reference.model.tokenizer, prepared.model.tokenizer
        rows = []
        for it in items:
            ids = tok(it.prompt)["input_ids"]
            if ref_tok(it.prompt)["input_ids"] != ids:
                raise SettingError(f"{NAME}: {prepared.label} and the reference {reference.label} tokenise "
                                   "differently; KL needs one vocabulary: compare models that share a tokenizer")
            var = log_probs(prepared, ids)
            ref = var if prepared.fingerprint == reference.fingerprint else log_probs(reference, ids)
            rows.append({"id": it.record.id, **item_sums(ref, var, ids)})
        return rows

    def score(self, item, row):
        return {**row, "correct": True}  # nothing is wrong: the summary holds the measure

    def summarize(self, items, rows):
        kl = [(r["kl_sum"], r["positions"]) for r in rows]
        nll = [(r["nll_sum"], r["tokens"]) for r in rows]
        positions, tokens = sum(p for _, p in kl), sum(t for _, t in nll)
        mean_kl = sum(k for k, _ in kl) / positions if positions else 0.0
        ppl = math.exp(sum(v for v, _ in nll) / tokens) if tokens else float("nan")
        return {"benchmark": self.name, "split": self.split, "n": len(rows), "kind": "drift",
                "kl": mean_kl, "kl_ci95": bootstrap(kl, lambda a, b: a / b),
                "perplexity": ppl, "perplexity_ci95": bootstrap(nll, lambda a, b: np.exp(a / b)),
                "positions": positions, "tokens": tokens, "reference": self.reference.label}

    def wrong_case(self, item, row):
        return row

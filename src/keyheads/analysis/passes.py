"""END predictions for many knockout sets at once, near the cost of the work they must do.

The direct way (one full forward pass per set) runs every prompt through every layer once per knockout
set, with logits over the vocabulary at every position. Three facts make most of that
redundant, and this module skips it:

- Prompts that share a token prefix (a few-shot block) and a length form a group
  (keyheads.models.prompt_set). The prefix runs once per set (one batch row per set) and
  its keys/values serve every member without a copy per member (models.shared_prefix); the
  members then run only their own suffix tokens.
  The length must match too because the mean of a knocked-out head depends on the
  position's offset from END.
- Layers below a set's lowest knocked-out layer see clean inputs. A clean pass per group
  stores the residual stream entering the layers where passes start; a knockout pass
  enters there, with the layers below turned into pass-throughs.
- Only END's logits are read, so only END is unembedded.

Several sets share one pass: each batch row carries its own set (a per-row mask selects
which heads take their mean). The numbers equal the direct computation up to float
rounding (tests/analysis/test_passes.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from ..heads import Head
from ..knockout import Knockout
from ..models.hf_internals import start_at
from ..models.model import HookedModel
from ..models.prompt_set import PromptSet, run_end
from ..models.shared_prefix import SharedPrefix
from .common import Predictions

__all__ = ["EndPasses", "Work"]


@dataclass
class Work:
    """What the passes computed, for FLOP accounting: token-layers through decoder layers,
    (query, key) pairs of attention summed over layers, and END rows through the unembedding."""

    token_layers: int = 0
    attention_pairs: int = 0
    end_rows: int = 0
    passes: int = 0

    def add(self, rows_prefix: int, P: int, rows: int, S: int, layers: int, end_rows: int) -> None:
        """rows_prefix rows of P prefix tokens, then rows of S tokens after them, through `layers` layers."""
        self.token_layers += (rows_prefix * P + rows * S) * layers
        causal = lambda n: n * (n + 1) // 2  # noqa: E731
        self.attention_pairs += (rows_prefix * causal(P) + rows * (S * P + causal(S))) * layers
        self.end_rows += end_rows
        self.passes += 1


def _lowest(heads: Sequence[Head], n_layers: int) -> int:
    return min((l for l, _ in heads), default=n_layers)


def _head_edits(full: Knockout | None, sets: Sequence[Sequence[Head]], repeat: int, length: int, lo: int, hi: int,
                n_heads: int) -> dict:
    """Edit functions mean-ablating set s's heads in rows s*repeat..(s+1)*repeat-1, positions lo..hi-1."""
    layers = sorted({l for s in sets for l, _ in s})
    edits = {}
    for layer in layers:
        if full is None:
            raise ValueError("heads to knock out, but no means were computed")
        mask = torch.zeros(len(sets), n_heads, dtype=torch.bool)
        for r, s in enumerate(sets):
            for l, h in s:
                if l == layer:
                    mask[r, h] = True
        mask = mask.repeat_interleave(repeat, 0)[:, None, :, None]          # [rows, 1, H, 1]
        means = full._values(full.head_means[layer], full.head_global[layer], length)[lo:hi]  # [pos, H, hd]

        def edit(z, mask=mask, means=means):
            return torch.where(mask.to(z.device), means.to(z)[None], z)

        edits[f"{layer}.head_out"] = edit
    return edits


class EndPasses:
    """END predictions of a PromptSet under knockout sets (heads only), batched over sets.

    Args:
        max_rows: most batch rows of one suffix pass (sets x members); sets are packed into
            passes up to this many rows.
    """

    def __init__(self, model: HookedModel, prompts: PromptSet, full: Knockout | None, max_rows: int = 256):
        self.model, self.prompts, self.full, self.max_rows = model, prompts, full, max_rows
        self.work = Work()

    def _clean_pass(self, g: int, layers: set[int]) -> dict:
        """Clean END logits and the residual streams entering `layers`, for group g."""
        model, group = self.model, self.prompts.groups[g]
        L = model.n_layers
        points = [f"{l}.resid_pre" for l in sorted(layers) if 0 < l < L]
        P, m = len(group.prefix), len(group.index)
        with model.hooks(capture=points) as pre:
            shared = None
            if P:
                shared = SharedPrefix.from_cache(run_end(model, torch.tensor([group.prefix]), 0, want_cache=True)[1])
            prefix_resid = dict(pre)
        with model.hooks(capture=points) as suf:
            logits, _ = run_end(model, group.suffixes, P, mask=group.mask, shared=shared)
        self.work.add(1 if P else 0, P, m, group.length - P, L, m + (1 if P else 0))  # padding counts: it is computed
        resid = {int(k.split(".")[0]): (prefix_resid[k] if P else None, suf[k]) for k in points}
        return {"logits": logits.cpu(), "resid": resid}

    def _knockout_pass(self, g: int, sets: Sequence[Sequence[Head]], clean: dict) -> torch.Tensor:
        """END logits [len(sets) * members, vocab], set-major."""
        model, group, full = self.model, self.prompts.groups[g], self.full
        L, H = model.n_layers, model.n_heads
        start = min(_lowest(s, L) for s in sets)
        P, m, C, T = len(group.prefix), len(group.index), len(sets), group.length
        # no stream enters layer 0 or the end (a set of no heads): every layer runs
        prefix_resid, suffix_resid = clean["resid"][start] if start in clean["resid"] else (None, None)
        shared = None
        if P:
            resid = None if prefix_resid is None else prefix_resid.expand(C, -1, -1)
            with start_at(model.layers, start, resid), model.hooks(edit=_head_edits(full, sets, 1, T, 0, P, H)):
                _, knocked = run_end(model, torch.tensor([group.prefix] * C), 0, want_cache=True)
            # one prefix per set, from `start` up; the layers below pass through and attend nothing
            shared = SharedPrefix.from_cache(knocked)
        resid = None if suffix_resid is None else suffix_resid.repeat(C, 1, 1)
        with start_at(model.layers, start, resid), model.hooks(edit=_head_edits(full, sets, m, T, P, T, H)):
            logits, _ = run_end(model, group.suffixes.repeat(C, 1), P,
                                mask=None if group.mask is None else group.mask.repeat(C, 1), shared=shared)
        self.work.add(C if P else 0, P, C * m, T - P, L - start, C * m + (C if P else 0))
        return logits.cpu()

    @torch.no_grad()
    def logits(self, sets: Sequence[Sequence[Head]], reduce, progress: bool = False, desc: str = "knockout sets"):
        """Call reduce(set index, prompt indices, END logits [members, vocab]) for every set and group.

        Sets are packed into passes by their lowest layer, so that a pass starts as high as its
        sets allow.
        """
        if self.full is None and any(sets):
            raise ValueError("knockout sets need the means of their heads (full=None)")
        L = self.model.n_layers
        order = sorted(range(len(sets)), key=lambda i: (-_lowest(sets[i], L), i))
        clean_sets = [i for i in order if not sets[i]]
        todo = [i for i in order if sets[i]]
        total = sum(len(g.index) for g in self.prompts.groups) * len(sets)
        bar = tqdm(total=total, desc=desc, unit="prompt", disable=not progress, leave=False)
        for g, group in enumerate(self.prompts.groups):
            m = len(group.index)
            per_pass = max(1, self.max_rows // m)
            chunks = [todo[c:c + per_pass] for c in range(0, len(todo), per_pass)]
            starts = {min(_lowest(sets[i], L) for i in chunk) for chunk in chunks}
            with self.model.grouped_attention():
                clean = self._clean_pass(g, starts)
                for i in clean_sets:
                    reduce(i, group.index, clean["logits"])
                bar.update(m * len(clean_sets))
                for chunk in chunks:
                    logits = self._knockout_pass(g, [sets[i] for i in chunk], clean)
                    for j, i in enumerate(chunk):
                        reduce(i, group.index, logits[j * m:(j + 1) * m])
                    bar.update(m * len(chunk))
        bar.close()

    def predict(self, sets: Sequence[Sequence[Head]], answer_ids: Sequence[int], topk: int = 0,
                progress: bool = False) -> list[Predictions]:
        """The END predictions of every set, in prompt order."""
        n = self.prompts.n
        answers = torch.as_tensor(list(answer_ids))
        out = [Predictions(torch.empty(n, dtype=torch.long), torch.empty(n),
                           torch.empty(n, topk, dtype=torch.long) if topk else None,
                           torch.empty(n, topk) if topk else None) for _ in sets]

        def reduce(i, index, logits):
            probs = logits.softmax(-1)
            idx = torch.tensor(index)
            pred = out[i]
            pred.top1[idx] = probs.argmax(-1)
            pred.p_answer[idx] = probs.gather(1, answers[idx][:, None])[:, 0]
            if topk:
                p, t = probs.topk(topk, dim=-1)
                pred.topk_ids[idx], pred.topk_probs[idx] = t, p

        self.logits(sets, reduce, progress)
        return out

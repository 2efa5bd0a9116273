"""END predictions for many knockout sets at once, near the cost of the work they must do.

The direct way (`common.predict`) runs every prompt through every layer once per knockout
set, with logits over the vocabulary at every position. Three facts make most of that
redundant, and this module skips it:

- Prompts that share a token prefix (a few-shot block) and a length form a group. The
  prefix runs once per set (one batch row per set) and its keys/values serve every member;
  the members then run only their own suffix tokens. The length must match too because the
  mean of a knocked-out head depends on the position's offset from END.
- Layers below a set's lowest knocked-out layer see clean inputs. A clean pass per group
  stores the residual stream entering the layers where passes start; a knockout pass
  enters there, with the layers below turned into pass-throughs.
- Only END's logits are read, so only END is unembedded.

Several sets share one pass: each batch row carries its own set (a per-row mask selects
which heads take their mean). The numbers equal the direct computation up to float
rounding (tests/analysis/test_passes.py).
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Sequence

import torch
from tqdm.auto import tqdm

from ..components import Head
from ..knockout import Knockout
from ..models.model import HookedModel
from .common import Predictions


@dataclass
class Group:
    """Prompts run together: of equal length sharing their first `len(prefix)` tokens, or (with
    no prefix) of similar length, left-padded to the longest."""

    index: list[int]                  # positions of the members in the prompt list
    length: int                       # tokens per member (padded length for a padded group)
    prefix: list[int]                 # the shared ids (may be empty)
    suffixes: torch.Tensor            # [members, length - len(prefix)] ids
    mask: torch.Tensor | None = None  # [members, length] attention mask of a padded group


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _cluster(rows: list[list[int]], min_prefix: int) -> list[list[int]]:
    """Split equal-length rows into runs of sorted order that are cheaper computed together.

    A run costs its shared prefix once plus every member's suffix; a row joins the run when
    that is cheaper than starting a new run with it.
    """
    order = sorted(range(len(rows)), key=lambda i: rows[i])
    n_tok = len(rows[0])
    runs: list[list[int]] = []
    lcp = 0
    for i in order:
        if runs:
            new = min(lcp, _lcp(rows[runs[-1][0]], rows[i]), n_tok - 1)
            size = len(runs[-1])
            joined = new + (size + 1) * (n_tok - new)
            apart = lcp + size * (n_tok - lcp) + n_tok
            if new >= min_prefix and joined <= apart:
                runs[-1].append(i)
                lcp = new
                continue
        runs.append([i])
        lcp = n_tok - 1
    return runs


def _shares_prefix(model: HookedModel, length: int) -> bool:
    # a sliding-window layer drops keys older than its window, so a cached prefix longer than
    # that would not be what the full prompt sees
    window = getattr(model.config, "sliding_window", None)
    return window is None or length < window


class PromptSet:
    """Prompts tokenised once and grouped for END-only passes.

    Prompts of one length whose shared prefix pays for itself form prefix groups; the rest
    are batched by length with left padding, as a plain forward pass would batch them.
    """

    def __init__(self, model: HookedModel, prompts: Sequence[str], batch_size: int = 16, min_prefix: int = 8):
        self.model = model
        self.n = len(prompts)
        self.lengths = [0] * self.n
        ids = [model.tokens(p, add_special_tokens=True) for p in prompts]
        if any(not r for r in ids):
            raise ValueError("an empty prompt has no END position")
        by_len: dict[int, list[int]] = {}
        for i, r in enumerate(ids):
            by_len.setdefault(len(r), []).append(i)
            self.lengths[i] = len(r)
        self.groups: list[Group] = []
        loose: list[int] = []
        for length, members in sorted(by_len.items()):
            if not _shares_prefix(model, length):
                loose += members
                continue
            for run in _cluster([ids[i] for i in members], min_prefix):
                index = [members[j] for j in run]
                P = min(min(_lcp(ids[index[0]], ids[k]) for k in index), length - 1)
                if len(index) < 2 or P < min_prefix:
                    loose += index
                    continue
                self.groups.append(Group(index, length, ids[index[0]][:P], torch.tensor([ids[k][P:] for k in index])))
        loose.sort(key=lambda i: (len(ids[i]), i))
        pad = model.tokenizer.pad_token_id or 0
        for c in range(0, len(loose), batch_size):
            index = loose[c:c + batch_size]
            T = max(len(ids[i]) for i in index)
            suffixes = torch.full((len(index), T), pad, dtype=torch.long)
            mask = torch.zeros((len(index), T), dtype=torch.long)
            for r, i in enumerate(index):
                suffixes[r, T - len(ids[i]):] = torch.tensor(ids[i])
                mask[r, T - len(ids[i]):] = 1
            self.groups.append(Group(index, T, [], suffixes, None if bool(mask.all()) else mask))

    def longer_than(self, length: int) -> int:
        return sum(1 for n in self.lengths if n > length)


# ---- running part of the layer stack --------------------------------------------------------

@contextmanager
def start_at(model: HookedModel, layer: int, resid: torch.Tensor | None):
    """Layers below `layer` pass their input through; `layer` reads `resid` instead."""
    if resid is None or layer == 0:
        yield
        return
    layers = model.layers

    def passthrough(*args, **kwargs):
        return args[0] if args else kwargs["hidden_states"]

    def enter(mod, args, kwargs):
        if args:
            return (resid, *args[1:]), kwargs
        return args, dict(kwargs, hidden_states=resid)

    saved = [layers[i].__dict__.get("forward") for i in range(layer)]
    handle = layers[layer].register_forward_pre_hook(enter, with_kwargs=True)
    try:
        for i in range(layer):
            layers[i].forward = passthrough
        yield
    finally:
        handle.remove()
        for i, fwd in enumerate(saved):
            if fwd is None:
                del layers[i].forward
            else:
                layers[i].forward = fwd


def _run(model: HookedModel, ids: torch.Tensor, start: int, past=None, want_cache: bool = False,
         mask: torch.Tensor | None = None):
    """Forward of `ids` at positions start.. (a padded batch: `mask`, no cache); END logits only."""
    rows, n = ids.shape
    dev = model.device
    kwargs = dict(input_ids=ids.to(dev), use_cache=want_cache or past is not None)
    if mask is not None:
        kwargs.update(attention_mask=mask.to(dev), position_ids=(mask.cumsum(-1) - 1).clamp(min=0).to(dev))
    else:
        kwargs.update(position_ids=torch.arange(start, start + n, device=dev).expand(rows, n))
    if past is not None:
        kwargs.update(past_key_values=past, attention_mask=torch.ones(rows, start + n, dtype=torch.long, device=dev))
    try:
        out = model.hf(**kwargs, logits_to_keep=1)
    except TypeError:  # model classes without logits_to_keep
        out = model.hf(**kwargs)
    return out.logits[:, -1].float(), out.past_key_values


def _rows(cache, repeat: int, expand_only: bool = False):
    """The cache with every row repeated `repeat` times (row-major), as a new cache object."""
    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        layer = copy.copy(layer)
        if getattr(layer, "keys", None) is None:  # a layer the pass skipped: replaced by the caller
            pass
        elif expand_only:
            k, v = layer.keys, layer.values
            layer.keys = k.expand(repeat * k.shape[0], *k.shape[1:]) if k.shape[0] == 1 else k.repeat_interleave(repeat, 0)
            layer.values = v.expand(repeat * v.shape[0], *v.shape[1:]) if v.shape[0] == 1 else v.repeat_interleave(repeat, 0)
        else:
            layer.keys = layer.keys.repeat_interleave(repeat, 0)
            layer.values = layer.values.repeat_interleave(repeat, 0)
        new.layers.append(layer)
    return new


# ---- the engine ------------------------------------------------------------------------------

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


def _head_edits(full: Knockout, sets: Sequence[Sequence[Head]], repeat: int, length: int, lo: int, hi: int,
                n_heads: int) -> dict:
    """Edit functions mean-ablating set s's heads in rows s*repeat..(s+1)*repeat-1, positions lo..hi-1."""
    layers = sorted({l for s in sets for l, _ in s})
    edits = {}
    for layer in layers:
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
        """Clean END logits, the prefix cache and the residual streams entering `layers`, for group g."""
        model, group = self.model, self.prompts.groups[g]
        L = model.n_layers
        points = [f"{l}.resid_pre" for l in sorted(layers) if 0 < l < L]
        P, m = len(group.prefix), len(group.index)
        with model.hooks(capture=points) as pre:
            cache = None
            if P:
                _, cache = _run(model, torch.tensor([group.prefix]), 0, want_cache=True)
            prefix_resid = dict(pre)
        with model.hooks(capture=points) as suf:
            logits, _ = _run(model, group.suffixes, P, _rows(cache, m, expand_only=True) if P else None,
                             mask=group.mask)
        self.work.add(1 if P else 0, P, m, group.length - P, L, m + (1 if P else 0))  # padding counts: it is computed
        resid = {int(k.split(".")[0]): (prefix_resid.get(k), suf[k]) for k in points}
        return {"logits": logits.cpu(), "cache": cache, "resid": resid}

    def _knockout_pass(self, g: int, sets: Sequence[Sequence[Head]], clean: dict) -> torch.Tensor:
        """END logits [len(sets) * members, vocab], set-major."""
        model, group, full = self.model, self.prompts.groups[g], self.full
        L, H = model.n_layers, model.n_heads
        start = min(_lowest(s, L) for s in sets)
        P, m, C, T = len(group.prefix), len(group.index), len(sets), group.length
        prefix_resid, suffix_resid = clean["resid"].get(start, (None, None))
        cache = None
        if P:
            resid = None if prefix_resid is None else prefix_resid.expand(C, -1, -1)
            with start_at(model, start, resid), model.hooks(edit=_head_edits(full, sets, 1, T, 0, P, H)):
                _, knocked = _run(model, torch.tensor([group.prefix] * C), 0, want_cache=True)
            # below `start` the clean prefix is the knocked-out one; above, each set's rows repeat per member
            cache = _rows(knocked, m)
            cache.layers[:start] = _rows(clean["cache"], C * m, expand_only=True).layers[:start]
        resid = None if suffix_resid is None else suffix_resid.repeat(C, 1, 1)
        with start_at(model, start, resid), model.hooks(edit=_head_edits(full, sets, m, T, P, T, H)):
            logits, _ = _run(model, group.suffixes.repeat(C, 1), P, cache,
                             mask=None if group.mask is None else group.mask.repeat(C, 1))
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
        """Predictions (as `common.predict` gives them) for every set, in prompt order."""
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


@torch.no_grad()
def clean_passes(model: HookedModel, prompts: PromptSet, edits: dict, progress: bool = False, desc: str = "passes"):
    """Run every group once without knockout, with `edits` installed while its own tokens run;
    yields each group after its pass. The last position of what the edits see is END.

    The shared prefix runs before the edits are installed, so an edit that keeps x[:, -1] sees
    END only; an edit that reads whole rows (an attention pattern) sees every key, prefix included.
    """
    for group in tqdm(prompts.groups, desc=desc, disable=not progress, leave=False):
        P, m = len(group.prefix), len(group.index)
        with model.grouped_attention():
            cache = _run(model, torch.tensor([group.prefix]), 0, want_cache=True)[1] if P else None
            with model.hooks(edit=edits):
                _run(model, group.suffixes, P, _rows(cache, m, expand_only=True) if P else None, mask=group.mask)
        yield group

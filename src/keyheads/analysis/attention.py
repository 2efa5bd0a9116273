"""Figures 5, 7 and 16: where the key heads look from the END token.

Only the END row of each key head's pattern is kept (hooked out of the eager attention
pattern as it is computed), so a thousand prompts cost one forward pass each and little
memory. Attention is summed per token role: operand A, operand B, the operator, the first
token (the usual attention sink) and every other token. The roles partition the keys, so
the five numbers of a head sum to one.

Labels (a simple rule, documented because the figure colours follow it): leaving the first
token out (attention sinks carry no content), a head is "operand" if A+B gets more of its
attention than the operator and than all other words together, "operator" if the operator
does, and "text" otherwise. `lean` is the binary call between the two task roles alone
(operand if A+B >= operator), for heads labelled "text" too.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import cast

import numpy as np
import torch

from ..heads import Head
from ..models.model import HookedModel
from ..models.prompt_set import PromptSet, clean_passes
from ..plotting import save_figure, subplots, token_label
from ..results.attention import HeadLabel
from .common import AnalysisError, Sample

ROLES = ("A", "B", "operator", "other", "first")
ROLE_NAMES = {"A": "operand A", "B": "operand B", "operator": "operator", "other": "other words",
              "first": "first token"}
ROLE_COLOURS = {"A": "tab:red", "B": "salmon", "operator": "tab:green", "other": "tab:gray", "first": "tab:blue"}
LABEL_COLOURS = {"operand": "tab:red", "operator": "tab:green", "text": "dimgray"}


def role_ids(positions: dict | None, length: int) -> np.ndarray:
    """Role index (into ROLES) of every token of an unpadded prompt; operands win over 'first'."""
    if positions is None:
        raise AnalysisError("attention by role needs token positions of A, B and the operator in the pairs file "
                            "(a 'positions' field on every line, as `keyheads data` writes it); this file has none")
    ids = np.full(length, ROLES.index("other"))
    ids[0] = ROLES.index("first")
    for role in ("A", "B", "operator"):
        pos = positions[role]
        for p in (pos if isinstance(pos, (list, tuple)) else [pos]):
            if not 0 <= p < length:
                raise AnalysisError(f"position {role}={p} is outside the {length}-token prompt")
            ids[p] = ROLES.index(role)
    return ids


@torch.no_grad()
def end_attention(model: HookedModel, prompts: Sequence[str], heads: Sequence[Head], batch_size: int = 16,
                  progress: bool = True) -> list[np.ndarray]:
    """Per prompt, [len(heads), n_tokens]: each head's attention from END to every (unpadded) key."""
    layers = sorted({l for l, _ in heads})
    rows: dict[int, torch.Tensor] = {}

    def keep_end_row(layer):
        def edit(pattern):  # [batch, head, query, key]: keep only the END query, pass the pattern on unchanged
            rows[layer] = pattern[:, :, -1].float().cpu()
            return pattern
        return edit

    prompts_set = PromptSet(model, prompts, batch_size)
    lengths = prompts_set.lengths
    out: list[np.ndarray | None] = [None] * len(prompts)
    edits = {f"{l}.pattern": keep_end_row(l) for l in layers}
    with model.eager_attention():
        for group in clean_passes(model, prompts_set, edits, progress, "attention"):
            T = group.length  # keys: the whole (padded) prompt, shared prefix included
            for j, i in enumerate(group.index):
                n = lengths[i]
                out[i] = torch.stack([rows[l][j, h, T - n:] for l, h in heads]).numpy()
    return cast(list[np.ndarray], out)  # every prompt is in exactly one group


def by_role(end_rows: Sequence[np.ndarray], samples: Sequence[Sample]) -> np.ndarray:
    """[n_samples, n_heads, 5]: attention summed over the tokens of each role."""
    out = np.zeros((len(samples), end_rows[0].shape[0], len(ROLES)))
    for i, (row, s) in enumerate(zip(end_rows, samples)):
        ids = role_ids(s.positions, row.shape[1])
        for r in range(len(ROLES)):
            out[i, :, r] = row[:, ids == r].sum(-1)
    return out


def top_other_tokens(model: HookedModel, end_rows: Sequence[np.ndarray], samples: Sequence[Sample],
                     k: int = 3) -> list[list[tuple[str, float]]]:
    """Per head, the k 'other words' tokens with the most attention on average (the END token itself is
    marked "(END)"): says what a head labelled "text" actually reads."""
    totals: list[defaultdict[str, float]] = [defaultdict(float) for _ in range(end_rows[0].shape[0])]
    for row, s in zip(end_rows, samples):
        ids = model.tokens(s.prompt, add_special_tokens=True)
        roles = role_ids(s.positions, len(ids))
        for p in np.flatnonzero(roles == ROLES.index("other")):
            name = token_label(model.tokenizer.decode([ids[p]])) + (" (END)" if p == len(ids) - 1 else "")
            for j in range(row.shape[0]):
                totals[j][name] += float(row[j, p])
    n = max(len(samples), 1)
    return [sorted(((t, v / n) for t, v in tot.items()), key=lambda tv: -tv[1])[:k] for tot in totals]


def label_heads(heads: Sequence[Head], mean_by_role: np.ndarray) -> list[HeadLabel]:
    """mean_by_role [n_heads, 5] -> operand / operator / text labels (see the module docstring)."""
    labels = []
    for head, m in zip(heads, mean_by_role):
        operand, operator, text = m[0] + m[1], m[2], m[3]
        label = ("operand", "operator", "text")[int(np.argmax([operand, operator, text]))]
        lean = "operand" if operand >= operator else "operator"
        labels.append(HeadLabel(head=head, label=label, lean=lean, operand_A_plus_B=float(operand),
                                operator=float(operator), other_words=float(text), first_token=float(m[4])))
    return labels


# ---- figures -----------------------------------------------------------------------------

def plot_by_role(per_task: dict[str, np.ndarray], counts: dict[str, int], heads: Sequence[Head],
                 labels: Sequence[HeadLabel], path) -> None:
    """Figure 5: per task, grouped bars (one group per key head, one bar per role)."""
    tasks = list(per_task)
    fig, axes = subplots(len(tasks), 1, figsize=(max(7.0, 0.9 * len(heads) + 2), 2.8 * len(tasks)), squeeze=False,
                         constrained_layout=True)
    x = np.arange(len(heads))
    width = 0.8 / len(ROLES)
    for ax, task in zip(axes[:, 0], tasks):
        for r, role in enumerate(ROLES):
            ax.bar(x + (r - 2) * width, per_task[task][:, r], width, color=ROLE_COLOURS[role], label=ROLE_NAMES[role])
        ax.set_xticks(x, [str(h) for h in heads])
        for tick, lab in zip(ax.get_xticklabels(), labels):
            tick.set_color(LABEL_COLOURS[lab.label])
            tick.set_fontweight("bold")
        ax.set_ylim(0, 1)
        ax.set_ylabel("attention from END")
        ax.set_title(f"{task} (n={counts[task]}): END-token attention of key heads by token role", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(ncol=5, fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("key head (layer.head, most important first); "
                           "label colour: red = operand-attending, green = operator-attending, grey = text")
    save_figure(fig, path)


def plot_cases(model: HookedModel, cases: Sequence[tuple[str, str]], end_rows: Sequence[np.ndarray],
               heads: Sequence[Head], path, max_tokens: int = 40) -> None:
    """Figure 7: per prompt, a heads x tokens heatmap of END attention (the last `max_tokens` tokens)."""
    fig, axes = subplots(len(cases), 1, figsize=(12, 0.35 * len(heads) * len(cases) + 1.6 * len(cases)), squeeze=False,
                         constrained_layout=True)
    for ax, (name, prompt), row in zip(axes[:, 0], cases, end_rows):
        ids = model.tokens(prompt, add_special_tokens=True)
        shown = slice(max(0, len(ids) - max_tokens), len(ids))
        im = ax.imshow(row[:, shown], aspect="auto", cmap="Reds", vmin=0, vmax=1)
        ax.set_xticks(range(len(ids[shown])), [token_label(model.tokenizer.decode([t])) for t in ids[shown]],
                      rotation=90, fontsize=8)
        ax.set_yticks(range(len(heads)), [str(h) for h in heads], fontsize=8)
        cut = " (last tokens)" if shown.start else ""
        ax.set_title(f"{name}: attention from END to each token{cut}", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.02, pad=0.01)
    save_figure(fig, path)


@torch.no_grad()
def full_patterns(model: HookedModel, prompts: Sequence[str], head: Head) -> list[np.ndarray]:
    layer, h = head
    out = []
    with model.eager_attention():
        for p in prompts:
            _, cache = model.run(model.encode([p]), capture=[f"{layer}.pattern"])
            out.append(cache[f"{layer}.pattern"][0, h].float().cpu().numpy())
    return out


def plot_patterns(model: HookedModel, cases: Sequence[tuple[str, str]], patterns: Sequence[np.ndarray],
                  head: Head, label: str, path, max_tokens: int = 24) -> None:
    """Figure 16: one head's full attention pattern (query x key) on several prompts, tokens on the axes."""
    fig, axes = subplots(1, len(cases), figsize=(4.6 * len(cases), 4.8), squeeze=False)
    for ax, (name, prompt), pat in zip(axes[0], cases, patterns):
        ids = model.tokens(prompt, add_special_tokens=True)
        s = max(0, len(ids) - max_tokens)
        toks = [token_label(model.tokenizer.decode([t])) for t in ids[s:]]
        ax.imshow(pat[s:, s:], cmap="Reds", vmin=0, vmax=1)
        ax.set_xticks(range(len(toks)), toks, rotation=90, fontsize=6)
        ax.set_yticks(range(len(toks)), toks, fontsize=6)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        ax.set_title(name, fontsize=8)
    fig.suptitle(f"attention pattern of head {str(head)} ({label}-attending)" +
                 (f", last {max_tokens} tokens" if any(len(model.tokens(p, add_special_tokens=True)) > max_tokens
                                                       for _, p in cases) else ""), fontsize=10)
    save_figure(fig, path)

"""Figure 6 (and 13-14): what the MLPs read and write, probed with the unembedding vectors.

At the END position of every reference prompt and for every layer:
  in_A, in_B   cos(MLP_in, W_U[A]), cos(MLP_in, W_U[B]): MLP_in is the residual stream the
               MLP reads (resid_mid; resid_pre in parallel-residual models), before its norm;
  in_other     cos(MLP_in, W_U[n]) averaged over the number tokens n other than A and B;
  in_C         cos(MLP_in, W_U[C]);
  write_C      cos(MLP_out - MLP_in, W_U[C]): the MLP's write into the residual stream
               (mlp_write) against the answer token C;
  write_other  the same against every other number token, averaged.

Per prompt, not only as a mean (answer_specific, [prompt][layer]), a shuffled-answer null:
  d_i[l] = cos(write_i[l], W_U[C_i]) - mean over the prompts j with C_j != C_i of cos(write_i[l], W_U[C_j]),
how much more layer l's MLP writes toward prompt i's own answer than toward the answers of the other prompts.
Each such j counts once, so a frequent answer weighs more: the null is the answer distribution of the prompts
themselves, not every number token alike, and d has expectation 0 in a model whose MLP writes do not depend on the
answer (random weights, say) whatever that distribution. write_i[l] and C_i are write_C's. A prompt with no
other-answer prompt has no null and is dropped; that happens only when all prompts share one answer, so the
list is either every prompt in order or empty. The stage (mlp_run) gives it one row per distinct prompt, in the
order of first appearance: a reference prompt repeated in the pairs file is one observation, not several.

All number tokens share a common direction (most visibly in tied-embedding models, where
the END token's own embedding is in the residual stream), so a raw cosine rises and falls with
"some number" as much as with "this number". The turning points are therefore read off
contrasts: the operand curve s = (in_A + in_B) / 2 - in_other and the answer curve
c = write_C - write_other. Rule (deterministic, no smoothing, 10% thresholds):
  inflection = the layer that ends the largest climb of s, i.e. argmax over l of
               s[l] - min(s[0..l]) (a plain argmax would pick layer 0 in a tied-embedding model,
               whose first attention layer can copy the operands' embeddings straight to END);
  start      = the first layer of that climb: one past the last earlier layer where s is
               still below min(s up to the inflection) + 10% of the rise;
  end        = the layer where c peaks, at or after the inflection.
The paper reads (13-18-28) for LLaMA2-7B off the same kind of curves (figures 6, 13, 14).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..models.model import HookedModel
from ..models.prompt_set import PromptSet, clean_passes
from ..plotting import new_figure, save_figure, subplots
from ..results.mlp import TurningPoints
from .common import AnalysisError, Sample, number_token

RULE = (
    "operand curve s = (in_A + in_B)/2 - in_other, answer curve c = write_C - write_other (per-layer means); "
    "inflection = argmax over l of s[l] - min(s[:l+1]) (the end of the largest climb); "
    "start = 1 + the last layer before the inflection with s < min(s[:inflection+1]) "
    "+ 10% of the rise; end = argmax of c at or after the inflection"
)
CURVES = ("in_A", "in_B", "in_other", "in_C", "write_C", "write_other")


def number_vocab(model: HookedModel, up_to: int = 100) -> dict[str, int]:
    """Number text -> token for the numbers below `up_to` that are one token ('0'..'9' for digit tokenizers)."""
    vocab: dict[str, int] = {}
    for v in range(up_to):
        ids = [i for i in model.tokens(" " + str(v)) if model.tokenizer.decode([i]).strip()]
        if len(ids) == 1 and ids[0] not in vocab.values():
            vocab[str(v)] = ids[0]
    return vocab


def mlp_read_point(model: HookedModel) -> str:
    return "resid_pre" if model.parallel_residual else "resid_mid"


def operand_token(model: HookedModel, sample: Sample, role: str) -> int:
    if sample.operands and role in sample.operands:
        return number_token(model, sample.operands[role])
    if sample.positions and role in sample.positions:
        return model.tokens(sample.prompt, add_special_tokens=True)[sample.positions[role]]
    raise AnalysisError(f"the MLP probes need operand {role}: the pairs file has neither 'operands' nor 'positions'")


@torch.no_grad()
def end_vectors(model: HookedModel, prompts: Sequence[str], batch_size: int = 16, progress: bool = True,
                desc: str = "MLP probes") -> tuple[torch.Tensor, torch.Tensor]:
    """([n, L, d] MLP input, [n, L, d] MLP write) at END; only the END row is kept from each hook."""
    read = mlp_read_point(model)
    L = model.n_layers
    store: dict[str, torch.Tensor] = {}

    def keep_end(key):
        def edit(x):
            store[key] = x[:, -1].float().cpu()
            return x
        return edit

    edits = {f"{l}.{p}": keep_end(f"{l}.{p}") for l in range(L) for p in (read, "mlp_write")}
    mlp_in = torch.empty(len(prompts), L, model.d_model)
    write = torch.empty(len(prompts), L, model.d_model)
    for group in clean_passes(model, PromptSet(model, prompts, batch_size), edits, progress, desc):
        idx = torch.tensor(group.index)
        mlp_in[idx] = torch.stack([store[f"{l}.{read}"] for l in range(L)], 1)
        write[idx] = torch.stack([store[f"{l}.mlp_write"] for l in range(L)], 1)
    return mlp_in, write


def unit_rows(model: HookedModel, tokens) -> torch.Tensor:
    w = model.unembedding_rows(tokens).float().cpu()
    return w / w.norm(dim=-1, keepdim=True)


def cosines(x: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """x [n, L, d], directions [n, d] (one per sample) -> [n, L]."""
    x = x / x.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    return torch.einsum("nld,nd->nl", x, directions)


def probe(
    model: HookedModel, samples: Sequence[Sample], batch_size: int = 16, progress: bool = True
) -> dict[str, np.ndarray]:
    """The six curves per sample and layer, {name: [n, L]} (see the module docstring)."""
    return curves_of(model, samples, *end_vectors(model, [s.prompt for s in samples], batch_size, progress))


def curves_of(model: HookedModel, samples: Sequence[Sample], mlp_in: torch.Tensor,
              write: torch.Tensor) -> dict[str, np.ndarray]:
    """probe's curves from end_vectors' tensors (the MLP step reuses them for answer_specific)."""
    a = [operand_token(model, s, "A") for s in samples]
    b = [operand_token(model, s, "B") for s in samples]
    c = [s.answer_id for s in samples]
    numbers = list(number_vocab(model).values())
    out = {"in_A": cosines(mlp_in, unit_rows(model, a)), "in_B": cosines(mlp_in, unit_rows(model, b)),
           "in_C": cosines(mlp_in, unit_rows(model, c)), "write_C": cosines(write, unit_rows(model, c))}
    # other numbers: the mean of the cosines (not the cosine with a mean direction)
    out["write_other"] = _mean_cos_except(write, model, numbers, [[ci] for ci in c])
    out["in_other"] = _mean_cos_except(mlp_in, model, numbers, [[ai, bi] for ai, bi in zip(a, b)])
    return {k: v.numpy() for k, v in out.items()}


def answer_specific(model: HookedModel, write: torch.Tensor, answers: Sequence[int]) -> np.ndarray:
    """[n, L]: d_i[l] of the module docstring from end_vectors' writes [n, L, d] and the answer tokens C_i;
    [0, L] when all prompts share one answer."""
    tokens = sorted(set(answers))
    column = torch.tensor([tokens.index(t) for t in answers])              # prompt i's answer among tokens
    unit = write / write.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    cos = torch.einsum("nld,ud->nlu", unit, unit_rows(model, tokens))      # [n, L, distinct answers]
    # the other prompts, grouped by answer: the prompts with answer u, none of them if u is i's own answer
    weight = torch.bincount(column, minlength=len(tokens)).float().repeat(len(answers), 1)
    weight[torch.arange(len(answers)), column] = 0
    own = cos.gather(2, column[:, None, None].expand(-1, cos.shape[1], 1))[..., 0]
    other = (cos * weight[:, None]).sum(-1) / weight.sum(-1, keepdim=True).clamp(min=1)
    return (own - other)[weight.sum(-1) > 0].numpy()


def _mean_cos_except(x: torch.Tensor, model: HookedModel, numbers: list[int], skip: list[list[int]]) -> torch.Tensor:
    """[n, L]: cos(x, W_U[t]) averaged over the number tokens t not in skip[i]."""
    unit = x / x.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    all_cos = torch.einsum("nld,md->nlm", unit, unit_rows(model, numbers))             # [n, L, m]
    keep = torch.tensor([[t not in sk for t in numbers] for sk in skip], dtype=torch.float32)  # [n, m]
    return (all_cos * keep[:, None]).sum(-1) / keep.sum(-1, keepdim=True).clamp(min=1)


def contrasts(means: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(operand curve, answer curve) for the turning points, from the per-layer means."""
    return (means["in_A"] + means["in_B"]) / 2 - means["in_other"], means["write_C"] - means["write_other"]


def turning_points(operand_curve: Sequence[float] | np.ndarray, answer_curve: Sequence[float] | np.ndarray,
                   frac: float = 0.1) -> TurningPoints:
    """Start, inflection and end layers by the rule in the module docstring."""
    s = np.asarray(operand_curve, dtype=float)
    c = np.asarray(answer_curve, dtype=float)
    inflection = int(np.argmax(s - np.minimum.accumulate(s)))  # end of the largest climb
    base = float(np.min(s[:inflection + 1]))
    level = base + frac * (s[inflection] - base)
    below = [l for l in range(inflection) if s[l] < level]
    start = below[-1] + 1 if below else 0
    end = inflection + int(np.argmax(c[inflection:]))
    return TurningPoints(start=start, inflection=inflection, end=end)


# ---- figure 6(c): one case, layer by layer --------------------------------------------------

@torch.no_grad()
def case_numbers(model: HookedModel, prompt: str) -> tuple[list[str], np.ndarray]:
    """(number texts, [L, m] cosine of each layer's MLP write at END with each number token)."""
    vocab = number_vocab(model)
    _, write = end_vectors(model, [prompt], progress=False)
    unit = write[0] / write[0].norm(dim=-1, keepdim=True).clamp(min=1e-12)
    return list(vocab), (unit @ unit_rows(model, list(vocab.values())).T).numpy()


def top_numbers(names: Sequence[str], cos: np.ndarray, k: int = 3) -> list[list[str]]:
    return [[names[j] for j in np.argsort(-row, kind="stable")[:k]] for row in cos]


# ---- figures -------------------------------------------------------------------------------

def _band(ax, curves: np.ndarray, colour: str, label: str) -> None:
    layers = np.arange(curves.shape[1])
    mean = curves.mean(0)
    lo, hi = np.percentile(curves, 25, axis=0), np.percentile(curves, 75, axis=0)
    ax.plot(layers, mean, "o-", ms=3, color=colour, label=label)
    ax.fill_between(layers, lo, hi, color=colour, alpha=0.2)


def _marks(ax, tp: TurningPoints, labels: bool = True) -> None:
    # labels at staggered heights: the three layers are often only a few apart
    for (layer, name), y in zip(((tp.start, "start"), (tp.inflection, "inflection"), (tp.end, "end")),
                                (0.97, 0.89, 0.81)):
        ax.axvline(layer, color="black", ls=":", lw=1)
        if labels:
            ax.text(layer + 0.15, y, f"{name} {layer}", transform=ax.get_xaxis_transform(), fontsize=7, va="top",
                    bbox={"facecolor": "white", "alpha": 0.7, "lw": 0, "pad": 1})


def plot_curves(curves: dict[str, np.ndarray], tp: TurningPoints, path_in, path_out, model_name: str) -> None:
    """Figures 6(a) and 6(b): raw cosines (top) and the contrast the turning points are read from (bottom)."""
    n, L = curves["in_A"].shape
    operand = (curves["in_A"] + curves["in_B"]) / 2 - curves["in_other"]
    answer = curves["write_C"] - curves["write_other"]
    panels = (
        (path_in, f"{model_name}: MLP input vs operand tokens at END (n={n})",
         [("in_A", "tab:red", "cos(MLP_in, W_U[A])"), ("in_B", "tab:orange", "cos(MLP_in, W_U[B])"),
          ("in_other", "tab:gray", "cos(MLP_in, W_U[other numbers]) (mean)")],
         operand, "operand curve: (A + B) / 2 - other"),
        (path_out, f"{model_name}: what each MLP adds at END vs number tokens (n={n})",
         [("write_C", "tab:green", "cos(MLP_out - MLP_in, W_U[C]) (right answer)"),
          ("write_other", "tab:gray", "cos(MLP_out - MLP_in, W_U[other numbers]) (mean)")],
         answer, "answer curve: C - other"),
    )
    for path, title, lines, contrast, contrast_label in panels:
        fig, (ax, bx) = subplots(2, 1, figsize=(7.5, 6), sharex=True, gridspec_kw={"height_ratios": [3, 2]},
                                 constrained_layout=True)
        for key, colour, label in lines:
            _band(ax, curves[key], colour, label)
        _band(bx, contrast, "black", contrast_label)
        _marks(ax, tp)
        _marks(bx, tp, labels=False)
        for a in (ax, bx):
            a.axhline(0, color="gray", lw=0.5)
            a.grid(alpha=0.3)
            a.legend(fontsize=8, loc="best")
        ax.set(ylabel="cosine similarity", title=title + "; mean, band = 25-75%")
        bx.set(xlabel="layer", ylabel="contrast", xlim=(0, L - 1))
        save_figure(fig, path)


def plot_case(names: Sequence[str], cos: np.ndarray, prompt: str, answer: str, path, k: int = 3) -> None:
    fig, ax = new_figure(max(5.0, 0.45 * len(names) + 2), 0.28 * cos.shape[0] + 1.5)
    lim = float(np.abs(cos).max()) or 1.0
    im = ax.imshow(cos, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim)
    for layer, row in enumerate(cos):
        for rank, j in enumerate(np.argsort(-row, kind="stable")[:k]):
            ax.text(j, layer, str(rank + 1), ha="center", va="center", fontsize=6,
                    fontweight="bold" if names[j] == answer else "normal")
    ax.set_xticks(range(len(names)), names, fontsize=7)
    ax.set_yticks(range(cos.shape[0]), range(cos.shape[0]), fontsize=7)
    ax.set(xlabel="number token", ylabel="layer")
    tail = prompt.splitlines()[-1] if prompt.strip() else prompt
    ax.set_title(f"MLP_out - MLP_in vs number tokens for {tail.strip()!r} (answer {answer}); "
                 "1-3 = top numbers per layer", fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.03, label="cosine")
    save_figure(fig, path)

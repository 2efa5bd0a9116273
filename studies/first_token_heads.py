"""Key heads identified with first-token answers (the paper's data) against single-token answers only (the
data of the earlier studies): do the same heads come out, and as strongly? The comparison part of a first-token
study's page, computed from two run folders (two committed records).

With a tokenizer that splits digits, single-token answers keep only results below 10; with first-token
answers, '12' is scored by its first token and the pairs span the paper's whole range. Each side is a run of
`keyheads run CONFIG --stages data,identify,knockout`: configs/first-token-smollm2.yaml against
configs/single-token-smollm2.yaml, and configs/first-token-qwen1.5b.yaml against the Qwen study itself. The two
configs of a pair differ only in the answer filter and patching's `first_token` (tests/test_config_files.py).
The part compares the two effects.json files: the overlap of the top 10 and the top 32, the Spearman rank
correlation of all head effects, and the largest effect (the most negative: effects.json stores the relative
change of the answer logit, (patched - original) / original, as a fraction, so -0.05 is the paper's -5%). Then
each set's knockout curves (top-k by its own effects against random orders) side by side.

studies/pages.py writes the part into the page of a study whose entry in studies/studies.json names the study it
is `against`. For two run folders not yet recorded:

    python -m studies.first_token_heads FIRST_TOKEN_RUN SINGLE_TOKEN_RUN
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import textwrap
from pathlib import Path

from keyheads.effects import Effects
from keyheads.results.knockout import KnockoutCurves
from keyheads.runfolder import RunFolder

TOP_K = 32
SHOWN_K = (2, 6, 10, 20)  # the curves' k shown in the table (those the curves reach)
WAYS = ("single-token", "first-token")


def _curves(run: RunFolder) -> KnockoutCurves | None:
    """The knockout curves of a run folder (read as their type), or None when its knockout has none."""
    result = run.knockout_record
    return None if result is None else result.curves


def curves_table(curves: dict[str, KnockoutCurves]) -> str:
    """Accuracy with the top-k heads (by each set's own effects) knocked out, and the random orders' mean ± std."""
    head = "| | k = 0 | " + " | ".join(f"k = {k}" for k in SHOWN_K) + " |"
    lines = [head, "|---|" + "---:|" * (1 + len(SHOWN_K))]
    for way, c in curves.items():
        ks = c.k
        top = [f"{100 * c.effect_rank[ks.index(k)]:.1f}%" if k in ks else "-" for k in SHOWN_K]
        rnd = [f"{100 * c.random_mean[ks.index(k)]:.1f} ± {100 * c.random_std[ks.index(k)]:.1f}%"
               if k in ks else "-" for k in SHOWN_K]
        lines.append(f"| {way}: top-k | {100 * c.effect_rank[0]:.1f}% | " + " | ".join(top) + " |")
        lines.append(f"| {way}: random-k | {100 * c.random_mean[0]:.1f}% | " + " | ".join(rnd) + " |")
    return "\n".join(lines)


def curves_summary(curves: dict[str, KnockoutCurves]) -> str:
    """Where each top-k curve lies against its random band, and the top 10's relative drop, in words."""
    parts = []
    for way, c in curves.items():
        below = [k for k, top, m, sd in zip(c.k, c.effect_rank, c.random_mean, c.random_std)
                 if k > 0 and top < m - sd]
        k10 = 10 if 10 in c.k else c.k[-1]
        i10 = c.k.index(k10)
        drop = c.effect_rank[i10] / c.effect_rank[0] - 1
        if not below:
            since = "at no k below the random band (mean - std)"
        elif below == list(range(below[0], c.k[-1] + 1)):
            since = f"below the random band (mean - std) at every k from {below[0]}"
        else:
            since = f"below the random band at k = {', '.join(map(str, below))}"
        parts.append(f"With {way} answers the top-k curve lies {since}; the top {k10} cost {100 * drop:+.1f}% "
                     f"relative, {k10} random heads {100 * (c.random_mean[i10] / c.random_mean[0] - 1):+.1f}%.")
    return textwrap.fill(" ".join(parts), 110)


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def same_pairs(a: list[dict], b: list[dict]) -> int:
    """How many pairs of `a` are in `b` too (same reference, counterfactual and answer)."""
    key = lambda r: (r["reference"], r["counterfactual"], str(r["answer"]))  # noqa: E731
    return len({key(r) for r in a} & {key(r) for r in b})


def summary(found: dict, shared: int, n_first: int, past: dict[str, int]) -> str:
    """What the comparison shows, in words chosen by the figures alone."""
    (_, e_s), (_, e_f) = found["largest"]
    k10, k32 = found["overlap"][10], found["overlap"][TOP_K]
    text = (f"{shared} of the {n_first} first-token pairs are also in the single-token set (answers below 10, "
            f"which both filters keep; with operands 1-9 that is all of subtraction and division). The top 10 "
            f"share {k10} heads and the top {TOP_K} share {k32} (rho {found['rho']:.2f}); "
            f"the largest effect is {100 * e_f:+.1f}% with first-token answers "
            f"against {100 * e_s:+.1f}% with single-token ones. ")
    if past["first-token"] == past["single-token"] == 0:
        text += ("With first-token answers no head passes the paper's -5% either, so on this model the weak "
                 "heads do not come from the single-token filter.")
    elif past["first-token"] > past["single-token"]:
        text += (f"With first-token answers {past['first-token']} heads pass the paper's -5%, against "
                 f"{past['single-token']} with single-token answers: the filter weakened the effects.")
    else:
        text += (f"Heads past the paper's -5%: {past['first-token']} with first-token answers, "
                 f"{past['single-token']} with single-token ones.")
    return textwrap.fill(text, 110)


def compare(a_path, b_path, ks=(10, 32)) -> dict:
    """Two effects.json files of the same model: the top heads of each (most negative first), their overlap
    at each k, the Spearman rank correlation of all head effects measured in both, the largest (most
    negative) effect of each."""
    from scipy.stats import spearmanr

    a, b = Effects.load(a_path), Effects.load(b_path)
    if len(a.heads) != len(b.heads) or any(len(x) != len(y) for x, y in zip(a.heads, b.heads)):
        raise SystemExit(f"{a_path} and {b_path} are not for the same layers x heads")
    ranked_a, ranked_b = a.ranked(), b.ranked()
    pairs = [(a.effect(h), b.effect(h)) for h in ranked_a if not (math.isnan(a.effect(h)) or math.isnan(b.effect(h)))]
    rho, p = spearmanr([x for x, _ in pairs], [y for _, y in pairs])
    return {
        "top": {k: ([tuple(h) for h in ranked_a[:k]], [tuple(h) for h in ranked_b[:k]]) for k in ks},
        "overlap": {k: len(set(ranked_a[:k]) & set(ranked_b[:k])) for k in ks},
        "rho": float(rho), "p": float(p), "n_heads": len(pairs),
        "largest": ((tuple(ranked_a[0]), a.effect(ranked_a[0])), (tuple(ranked_b[0]), b.effect(ranked_b[0]))),
        "n_samples": (a.n_samples, b.n_samples), "n_excluded": (a.n_excluded, b.n_excluded),
    }


def heads_text(heads, effects: Effects) -> str:
    return ", ".join(f"{l}.{h} ({100 * effects.effect((l, h)):+.1f}%)" for l, h in heads)




def comparison_part(first: RunFolder, single: RunFolder, against: str) -> list[str]:
    """The page part comparing a first-token run with its single-token side (the study called `against`)."""
    runs = {"single-token": RunFolder.of(single), "first-token": RunFolder.of(first)}
    title = ["## Against single-token answers", ""]
    missing = [w for w, r in runs.items() if not r.effects.is_file() or not r.pairs.is_file()]
    if missing:
        return title + [f"The {' and '.join(missing)} side has no identify stage in its record yet: the comparison "
                        f"waits for it (study `{against}`)."]
    found = compare(runs["single-token"].effects, runs["first-token"].effects, ks=(10, TOP_K))
    eff = {w: Effects.load(r.effects) for w, r in runs.items()}
    rows = {w: read_rows(r.pairs) for w, r in runs.items()}
    counts = {w: collections.Counter(r["task"] for r in rows[w]) for w in WAYS}
    past = {w: sum(v < -0.05 for r in eff[w].heads for v in r) for w in WAYS}
    tasks = sorted(set(counts["single-token"]) | set(counts["first-token"]))
    table = ["| | " + " | ".join(tasks) + " | all | samples patched (excluded) |",
             "|---|" + "---:|" * (len(tasks) + 2)]
    for i, w in enumerate(WAYS):
        table.append(f"| {w} | " + " | ".join(str(counts[w][t]) for t in tasks) +
                     f" | {sum(counts[w].values())} | {found['n_samples'][i]} ({found['n_excluded'][i]}) |")
    (h_s, e_s), (h_f, e_f) = found["largest"]
    k10, k32 = found["overlap"][10], found["overlap"][TOP_K]
    lines = title + [
        f"This record's first-token answers against the single-token answers of study `{against}` (its record and "
        "page are listed in studies/RESULTS.md). Path patching stores each head's mean relative change of the "
        "answer logit as a fraction, negative when patching the head lowers the logit, so the largest effect is "
        "the most negative (shown in percent).", "", "Pairs kept, per task:", "", *table, "",
        "Top 10 heads, most negative first (layer.head, effect):", "",
        f"- single-token answers: {heads_text(found['top'][10][0], eff['single-token'])}",
        f"- first-token answers: {heads_text(found['top'][10][1], eff['first-token'])}", "",
        "| | single-token | first-token |", "|---|---:|---:|",
        f"| largest effect (most negative) | {100 * e_s:+.1f}% ({h_s[0]}.{h_s[1]}) | "
        f"{100 * e_f:+.1f}% ({h_f[0]}.{h_f[1]}) |",
        f"| heads past the paper's -5% | {past['single-token']} | {past['first-token']} |", "",
        f"- Overlap of the top 10: {k10} of 10; of the top {TOP_K}: {k32} of {TOP_K}.",
        f"- Spearman rank correlation of the {found['n_heads']} head effects: rho {found['rho']:.3f} "
        f"(p {found['p']:.2g}).", "",
        summary(found, same_pairs(rows["first-token"], rows["single-token"]), len(rows["first-token"]), past)]
    curves = {w: _curves(r) for w, r in runs.items()}
    if all(c is not None for c in curves.values()):
        lines += ["", "Knockout curves on each set's own prompts, its own top heads by effect against random orders "
                  "(accuracy of the answer token):", "", curves_table(curves), "", curves_summary(curves)]
    else:
        lines += ["", "Knockout curves: not in both records yet."]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", type=Path, help="run folder with first-token answers")
    ap.add_argument("single", type=Path, help="run folder with single-token answers")
    args = ap.parse_args()
    print("\n".join(comparison_part(args.first, args.single, str(args.single))))


if __name__ == "__main__":
    main()

"""Did the paper's claims hold on this model? One verdict per claim, from the numbers the stages wrote.

This module is the one place a claim's verdict is decided, by the rules keyheads.report.rules states (each claim's
test or descriptive threshold, its family, what each verdict requires, and the rules' version). A `Finding` carries
the verdict, the evidence quoting the numbers it used (so a reader can redo the call), the rule and its version.
A verdict is one of five (`VERDICTS`):
- holds / does not hold: the rule's conditions are all met / none is;
- partly: some are;
- not testable: the evidence is there, but cannot decide the claim (nothing to break, a skill the model lacks);
- not measured: some evidence the rule needs is missing (a stage, a per-item file, a measure not saved).
Rows resting on a measurement test it with the row's own sampling noise (exact McNemar or Fisher tests on items or
prompts, a bootstrap over prompts); descriptive rows (1, 2, 5, 10) compare a count with a threshold, and say so.

Where a claim rests on accuracies of the eval table, the evidence also gives each row against the base row item by
item (keyheads.report.stats): items gained / lost, the change in points with its 95% interval, and the exact
McNemar p with Holm's correction over every item-by-item test of the table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from ..effects import PAPER_THRESHOLD
from ..evaluation.settings import CHANCE, display
from ..numbers import human
from ..results.finetune import FinetuneResult
from ..results.knockout import KnockoutResult
from ..runfolder import RunFolder
from .markup import is_num, pct, points
from .rules import (
    BEYOND_RANDOM,
    FEW_HEADS,
    GENERIC_MARGIN,
    LIKE_FULL,
    MIN_DRAWS,
    MIN_PROMPTS,
    PAPER_SPEEDUP,
    RULE,
    RULES_VERSION,
    TRANSFER_GAP,
)
from .rundata import (
    EvalRow,
    EvalTable,
    delta_band,
    eval_table,
    first_of,
    main_precise,
    paired_family,
    precise_like,
)
from .stats import (
    ALPHA,
    DETECT,
    POWER,
    PairedTest,
    above_chance_p,
    bootstrap_mean_ci,
    fisher_fewer_p,
    fmt_p,
    holm,
    mcnemar_greater_p,
    mcnemar_items,
    paired_sets,
    seed_free,
    smaller_p,
)

SINGLE_DRAW = "(single random draw)"

Verdict = Literal["holds", "partly", "does not hold", "not testable", "not measured"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)

Pairs = dict[tuple[str, str], PairedTest]


@dataclass(frozen=True)
class Finding:
    """One claim of the paper on one run: its verdict, the numbers behind it and the rule that decided it."""

    claim: str
    verdict: Verdict
    evidence: str
    rule: str = ""  # the rule's test and what each verdict requires (keyheads.report.rules)
    key: str = ""   # the key numbers, a few words, for a table cell
    row: int = 0    # the claim's row in the findings table (the paper's ten, then keyheads' additions)
    version: int = RULES_VERSION  # the version of the rules it was judged under

    def to_json(self) -> dict:
        return {"row": self.row, "claim": self.claim, "verdict": self.verdict, "key": self.key,
                "evidence": self.evidence, "rule": self.rule, "rules_version": self.version}


def _claim(row: int, verdict: Verdict, evidence: str, key: str = "") -> Finding:
    rule = RULE[row]
    return Finding(rule.claim, verdict, evidence, rule.text(), key, row)


def _count(accuracy: float, n: int) -> int:
    """The prompts right of n, from an accuracy the stage wrote as right / n."""
    return round(accuracy * n)


def few_key_heads(run: RunFolder) -> Finding:
    eff = run.effects_record
    if eff is None or not eff.heads:
        return _claim(1, "not measured", "identify did not run")
    if eff.metric != "relative-logit":
        return _claim(1, "not testable", f"effects are in metric {eff.metric!r}; the -5% rule needs relative-logit")
    values = [v for row in eff.heads for v in row]
    below = sum(1 for v in values if is_num(v) and v < PAPER_THRESHOLD)
    share = below / len(values)
    best = min((v for v in values if is_num(v)), default=float("nan"))
    return _claim(1, "holds" if 0 < share < FEW_HEADS else "does not hold",
                  f"{below} of {len(values)} heads ({pct(share)}) are below -5%; the strongest head changes the "
                  f"answer logit by {pct(best)}",
                  f"{below} of {len(values)} heads past -5%; strongest {pct(best)}")


def where_heads_sit(run: RunFolder) -> Finding:
    keys, eff = run.key_heads_record, run.effects_record
    if keys is None or eff is None or not keys.heads:
        return _claim(2, "not measured", "identify did not run or took no key heads")
    layers = len(eff.heads)
    lo, hi = layers / 3, 2 * layers / 3  # the paper's 12-17 of 32 lie in the middle third
    inside = sum(lo <= h.layer < hi for h in keys.heads)
    verdict: Verdict = "holds" if 2 * inside > len(keys.heads) else "partly" if inside else "does not hold"
    span = f"{min(h.layer for h in keys.heads)}-{max(h.layer for h in keys.heads)}"
    return _claim(2, verdict, f"key heads in layers {span} of {layers}; {inside} of {len(keys.heads)} in the "
                  f"middle third (layers {math.ceil(lo)}-{math.ceil(hi) - 1})",
                  f"layers {span} of {layers}; {inside} of {len(keys.heads)} in the middle third")


def knockout_beyond_random(run: RunFolder) -> Finding:
    ko = run.knockout_record
    if ko is None:
        return _claim(3, "not measured", "knockout did not run")
    key = ko.key_heads
    n_heads, before, after = len(key.heads), key.accuracy_before, key.accuracy_after
    draws, n, made = _random_at(ko, n_heads)
    if not made:
        return _claim(3, "not measured", "no random-head comparison was computed (no curves and no transfer control)")
    if not draws:
        return _claim(3, "not testable", f"every random draw of {n_heads} heads knocks out the key heads themselves: "
                      "the model has no other heads to compare with")
    if not is_num(before) or before <= 0:
        return _claim(3, "not testable", "no prompt was answered right before the knockout: nothing to break")
    right = _count(after, n)
    tests = holm([fisher_fewer_p(right, n, _count(d, n), n) for d in draws])
    wins = sum(p < ALPHA for p in tests)
    gap = sum(draws) / len(draws) - after
    verdict: Verdict = ("holds" if wins == len(draws) and len(draws) >= MIN_DRAWS and gap >= BEYOND_RANDOM
                        else "partly" if wins else "does not hold")
    return _claim(3, verdict,
                  f"accuracy {pct(before)} -> {pct(after)} ({right} of {n} prompts) with the {n_heads} key heads out "
                  f"({ko.mean} mean); with {n_heads} random heads out {_draws(len(draws))}: "
                  + ", ".join(f"{_count(d, n)}" for d in draws) + f" of {n} right, mean {pct(sum(draws) / len(draws))}"
                  f", {100 * gap:.1f} points above; one-sided Fisher p per draw (Holm over the draws): "
                  + ", ".join(fmt_p(p) for p in tests),
                  f"top-{n_heads} {pct(before)} → {pct(after)}; random-{n_heads} {pct(sum(draws) / len(draws))}; "
                  f"significant against {wins} of {len(draws)} draw{'s' * (len(draws) > 1)}")


def _random_at(ko: KnockoutResult, n: int) -> tuple[list[float], int, int]:
    """The random draws' accuracies with n heads out, the prompts each is over, and how many draws were made: the
    random-rank curves at k = n (one draw per seed), else the transfer table's control on the identification data. A
    draw that knocks out exactly the key heads is no control (a model with few heads draws it): it is left out."""
    curves = ko.curves
    if curves is not None and n in curves.k and curves.random_rank:
        i, key = curves.k.index(n), set(ko.key_heads.heads)
        orders = curves.random_orders or [[]] * len(curves.random_rank)
        kept = [draw[i] for draw, order in zip(curves.random_rank, orders) if set(order[:n]) != key]
        return kept, ko.n_samples, len(curves.random_rank)
    rows = ko.transfer.rows if ko.transfer is not None else []
    if rows and rows[0].random_draws():
        return rows[0].random_draws(), rows[0].n, len(rows[0].random_draws())
    return [], 0, 0


def _draws(draws: int) -> str:
    return SINGLE_DRAW if draws == 1 else f"({draws} random draws)"


def transfer(run: RunFolder) -> Finding:
    ko = run.knockout_record
    if ko is None or ko.transfer is None or not ko.transfer.rows:
        return _claim(4, "not measured", "the transfer sets were not run")
    rows = [r for r in ko.transfer.rows[1:] if r.accuracy_before > 0 and r.random_draws() and r.n > 0]
    if not rows:
        return _claim(4, "not testable", "no transfer set had right answers before the knockout and a random control")
    flat = [(i, fisher_fewer_p(_count(r.accuracy_after, r.n), r.n, _count(d, r.n), r.n))
            for i, r in enumerate(rows) for d in r.random_draws()]
    adjusted = holm([p for _, p in flat])
    significant = [[p < ALPHA for (j, _), p in zip(flat, adjusted) if j == i] for i in range(len(rows))]
    counts = []
    for r, sig in zip(rows, significant):
        mean = sum((d - r.accuracy_before) / r.accuracy_before for d in r.random_draws()) / len(r.random_draws())
        counts.append(all(sig) and r.relative_change <= mean - TRANSFER_GAP)
    draws = min(len(r.random_draws()) for r in rows)
    any_sig = any(any(s) for s in significant)
    verdict: Verdict = ("holds" if 2 * sum(counts) > len(rows) and draws >= MIN_DRAWS
                        else "partly" if any_sig else "does not hold")
    shown = "; ".join(f"{r.set}: {pct(r.relative_change)} vs random {pct(r.relative_change_random_heads)}, "
                      f"{sum(s)} of {len(s)} draws significant" for r, s in zip(rows, significant))
    return _claim(4, verdict,
                  f"relative accuracy change with key heads vs random heads out ({ko.mean} mean) {_draws(draws)}, "
                  f"one-sided Fisher tests, Holm over the {len(flat)} set-and-draw tests — {shown}. "
                  f"{sum(counts)} of {len(rows)} sets count (every draw significant and "
                  f"{100 * TRANSFER_GAP:.0f} points beyond the draws' mean)",
                  f"beyond random on {sum(counts)} of {len(rows)} sets ({draws} draw{'s' * (draws > 1)})")


def attend_operands(run: RunFolder) -> Finding:
    att = run.attention_record
    if att is None or not att.labels:
        return _claim(5, "not measured", "attention did not run")
    kinds = [label.label for label in att.labels]
    task = sum(1 for k in kinds if k in ("operand", "operator"))
    verdict: Verdict = "holds" if 2 * task > len(kinds) else "partly" if task else "does not hold"
    return _claim(5, verdict,
                  f"{kinds.count('operand')} operand-, {kinds.count('operator')} operator- and {kinds.count('text')} "
                  f"text-attending of {len(kinds)} key heads",
                  f"{kinds.count('operand')} operand and {kinds.count('operator')} operator heads of {len(kinds)}")


def later_mlps(run: RunFolder) -> Finding:
    mlp = run.mlp_record
    if mlp is None:
        return _claim(6, "not measured", "mlp did not run")
    d = mlp.answer_specific
    if d is None:
        return _claim(6, "not measured", "the mlp record has no per-prompt answer_specific measure (an earlier "
                      "release's); re-run the mlp stage")
    if len(d) < MIN_PROMPTS:
        return _claim(6, "not testable", f"{len(d)} distinct prompts with another prompt's answer to compare with, "
                      f"fewer than the {MIN_PROMPTS} the bootstrap needs")
    layers = len(d[0])
    later = [l for l in range(layers) if 2 * l >= layers]
    earlier = [l for l in range(layers) if 2 * l < layers]
    a = [sum(p[l] for l in later) / len(later) for p in d]
    b = [ai - sum(p[l] for l in earlier) / len(earlier) for ai, p in zip(a, d)]
    (alo, ahi), (blo, bhi) = bootstrap_mean_ci(a), bootstrap_mean_ci(b)
    verdict: Verdict = ("does not hold" if not alo > 0 else "holds" if blo > 0 else "partly")
    tp = mlp.turning_points
    return _claim(6, verdict,
                  f"over {len(d)} prompts, the later half's MLPs (layers {later[0]}-{later[-1]} of {layers}) write "
                  f"toward the prompt's own answer beyond other prompts' answers by {sum(a) / len(a):.3g} "
                  f"[{alo:.3g}, {ahi:.3g}] (mean cosine, 95% bootstrap interval), {sum(b) / len(b):.3g} "
                  f"[{blo:.3g}, {bhi:.3g}] more than the earlier half's; the answer curve's "
                  f"start-inflection-end {tp.text()}",
                  f"later half {sum(a) / len(a):.3g} [{alo:.3g}, {ahi:.3g}], minus earlier {sum(b) / len(b):.3g} "
                  f"[{blo:.3g}, {bhi:.3g}]")


def precise_sft(run: RunFolder, table: EvalTable | None, pairs: Pairs) -> list[Finding]:
    """Rows 7, 8 and 10: precise SFT against full SFT on math, on generic drift and on speed."""
    runs = run.finetune_records
    p, f = main_precise(runs), first_of(runs, "full")
    if p is None or f is None:
        why = "precise and full SFT did not both run"
        return [_claim(row, "not measured", why) for row in (7, 8, 10)]
    prow, frow = (table.of_run(p), table.of_run(f)) if table else (None, None)
    if table is None or prow is None or frow is None or table.base is None:
        why = "the fine-tuned variants were not evaluated"
        out = [_claim(7, "not measured", why), _claim(8, "not measured", why)]
    else:
        out = [_math_like_full(table, pairs, runs, (p, prow), (f, frow)), _less_drift(table, p, prow, f, frow)]
    return out + [_faster(runs, p, f)]


def _math_like_full(table: EvalTable, pairs: Pairs, runs: dict[str, FinetuneResult], precise: tuple[str, EvalRow],
                    full: tuple[str, EvalRow]) -> Finding:
    (p, prow), (f, frow) = precise, full
    pm, fm = table.mean_delta(prow, table.math()), table.mean_delta(frow, table.math())
    weak = underpowered(table, table.math())
    said = f"math accuracy {points(pm)} points with {p}, {points(fm)} with {f}{_random_note(runs, table, pm)}{weak}"
    key = f"math {points(pm)} ({p}) vs {points(fm)} ({f}) points" + ("; underpowered" if weak else "")
    ptests, ftests = _tests(pairs, [prow], table.math()), _tests(pairs, [frow], table.math())
    if pm is None or fm is None or not ptests or not ftests:
        return _claim(7, "not measured", said + _items(pairs, [prow, frow], table.math()), key)
    return _claim(7, matches_full(pm, fm, _gain(ptests), _gain(ftests)),
                  said + _items(pairs, [prow, frow], table.math()), key)


def matches_full(pm: float, fm: float, precise_gains: bool, full_gains: bool) -> Verdict:
    """Row 7 on the mean math changes of precise and full SFT and whether each row has a significant math gain."""
    if precise_gains:
        return "holds" if pm >= fm - LIKE_FULL else "partly"
    return "does not hold" if full_gains else "not testable"


def _gain(tests: list[PairedTest]) -> bool:
    return any(t.significant and t.delta > 0 for t in tests)


def _less_drift(table: EvalTable, p: str, prow: EvalRow, f: str, frow: EvalRow) -> Finding:
    dp, df = table.drift(prow), table.drift(frow)
    if dp is None or df is None or dp.kl is None or df.kl is None or not dp.kl_ci95 or not df.kl_ci95:
        return _claim(8, "not measured", "the KL from the base model on generic text, with its interval, was not "
                      "measured for both rows")
    pval = smaller_p(dp.kl, dp.kl_ci95, df.kl, df.kl_ci95)
    pg, fg = table.mean_delta(prow, table.generic()), table.mean_delta(frow, table.generic())
    return _claim(8, "holds" if pval < ALPHA else "does not hold",
                  f"KL from the base model on generic text {dp.kl:.4g} {_ci(dp.kl_ci95)} with {p}, {df.kl:.4g} "
                  f"{_ci(df.kl_ci95)} with {f}: one-sided p {fmt_p(pval)} that precise SFT's is smaller; generic "
                  f"accuracy {points(pg)} vs {points(fg)} points",
                  f"KL {dp.kl:.3g} ({p}) vs {df.kl:.3g} ({f}), p {fmt_p(pval)}")


def _faster(runs: dict[str, FinetuneResult], p: str, f: str) -> Finding:
    sp, sf = runs[p].train.samples_per_second, runs[f].train.samples_per_second
    tp, tf = runs[p].tuned_params, runs[f].tuned_params
    if not (is_num(sp) and is_num(sf)) or sf <= 0:
        return _claim(10, "not measured", "training speed was not recorded")
    ratio = sp / sf
    fewer = not is_num(tp) or not is_num(tf) or tp < tf
    verdict: Verdict = "holds" if ratio >= PAPER_SPEEDUP and fewer else "partly" if ratio > 1 and fewer \
        else "does not hold"
    return _claim(10, verdict, f"{sp:.3g} vs {sf:.3g} samples/s ({ratio:.2f}x), {human(tp)} vs {human(tf)} tuned "
                  f"parameters ({p} vs {f})", f"{sp:.3g} vs {sf:.3g} samples/s ({ratio:.2f}x)")


def random_place(run: RunFolder, table: EvalTable | None) -> Finding:
    runs = run.finetune_records
    name = next((k for k, v in runs.items() if v.random_heads), None)
    p = precise_like(runs, name) if name is not None else None
    if name is not None and p is None:
        return _claim(9, "not measured", f"no precise SFT run tunes as many heads and MLPs as {name}")
    prow = table.of_run(p) if table is not None and p is not None else None
    if p is None or name is None or table is None or table.base is None or prow is None:
        return _claim(9, "not measured", "precise SFT and SFT of random heads were not both run and evaluated")
    seeds = [k for k, v in runs.items() if v.random_heads and seed_free(k) == seed_free(name)]
    rows = [r for r in (table.of_run(k) for k in seeds) if r is not None]
    tests = [_pooled(run, table, r, prow) for r in rows]
    if not rows or any(t is None for t in tests):
        return _claim(9, "not measured", f"no per-item math outcomes of {p} and every evaluated draw of "
                      f"{seed_free(name)}")
    pvals = holm([mcnemar_greater_p(t.gained, t.lost) for t in tests if t is not None])
    wins = sum(q < ALPHA for q in pvals)
    verdict: Verdict = ("holds" if wins == len(rows) and len(rows) >= MIN_DRAWS else "partly" if wins
                        else "does not hold")
    pm = table.mean_delta(prow, table.math())
    draws = [table.mean_delta(r, table.math()) for r in rows]
    shown = "; ".join(f"{r.run or r.label}: {points(d)}, +{t.gained} / -{t.lost} items, one-sided p {fmt_p(q)}"
                      for r, d, t, q in zip(rows, draws, tests, pvals) if t is not None)
    weak = underpowered(table, table.math())
    return _claim(9, verdict,
                  f"mean math change {points(pm)} points with {p}; against each draw of {seed_free(name)} on the "
                  f"pooled math items ({p}'s items gained / lost against the draw; exact McNemar, Holm over the "
                  f"{len(rows)} draws) — {shown}{weak}",
                  f"math {points(pm)} ({p}); better than {wins} of {len(rows)} random draw"
                  f"{'s' * (len(rows) > 1)}" + ("; underpowered" if weak else ""))


def _pooled(run: RunFolder, table: EvalTable, reference: EvalRow, row: EvalRow) -> PairedTest | None:
    """`row` against `reference` item by item over every math benchmark together (None when a per-item file is
    missing or the two rows have different items)."""
    ref_wrong: set[str] = set()
    row_wrong: set[str] = set()
    n = 0
    for b in table.math():
        a, c = reference.summary(b), row.summary(b)
        if a is None or c is None or not isinstance(a.n, int) or a.n != c.n:
            return None
        w1, w2 = run.wrong_ids(reference.label, b), run.wrong_ids(row.label, b)
        if w1 is None or w2 is None:
            return None
        ref_wrong |= {f"{b}/{i}" for i in w1}
        row_wrong |= {f"{b}/{i}" for i in w2}
        n += a.n
    return paired_sets(ref_wrong, row_wrong, n) if n else None


def generic_kept(run: RunFolder, table: EvalTable | None, pairs: Pairs) -> Finding:
    ko = table.of_kind("knockout") if table else []
    if table is None or not ko or table.base is None or not table.generic():
        return _claim(11, "not measured", "the evaluation did not include a key-head knockout row and a generic "
                      "benchmark")
    row, base = ko[0], table.base
    generic, math_ = table.generic(), table.math()
    said = (f"generic accuracy {points(table.mean_delta(row, generic))}, math {points(table.mean_delta(row, math_))} "
            f"points with the key heads out" + (f" ({row.mean} mean)" if row.mean else ""))
    kl = table.drift(row)
    if kl is not None and kl.kl is not None:
        said += f"; its KL from the base model on generic text {kl.kl:.4g}" + (f" {_ci(kl.kl_ci95)}" if kl.kl_ci95
                                                                               else "")
    said += _items(pairs, [row], generic + math_)
    weak = underpowered(table, generic + math_)
    said += weak
    key = f"generic {points(table.mean_delta(row, generic))}, math {points(table.mean_delta(row, math_))} points" \
        + ("; underpowered" if weak else "")
    math_tests = _tests(pairs, [row], math_)
    if not math_tests or any((row.label, b) not in pairs for b in generic):
        return _claim(11, "not measured", said, key)
    generic_tests = {b: pairs[(row.label, b)] for b in generic}
    drops = any(t.significant and t.delta < 0 for t in math_tests)
    above = {b: above_chance_p(_count(acc, s.n), s.n, CHANCE[b]) for b in generic
             if b in CHANCE and (s := base.summary(b)) is not None and (acc := base.acc(b)) is not None
             and isinstance(s.n, int)}
    testable = [b for b, p in above.items() if p < ALPHA]
    said += ". Base model against chance (one-sided binomial): " + ", ".join(
        f"{display(b)} p {fmt_p(p)}" for b, p in above.items())
    if not testable:
        return _claim(11, "not testable", said + ("; math drops" if drops else "; math does not drop significantly"),
                      key + "; generic at chance")
    kept = all((t := generic_tests[b]) is not None and t.ci[0] > -GENERIC_MARGIN for b in testable)
    verdict: Verdict = "holds" if drops and kept else "partly" if drops or kept else "does not hold"
    return _claim(11, verdict, said, key)


def underpowered(table: EvalTable, benchmarks: list[str]) -> str:
    """'; underpowered: ARITH-ADD 60 items of the 359 ...' for the benchmarks whose items are fewer than a
    two-sided McNemar test needs to detect a 10-point change from the base row's accuracy at power 0.8; '' when
    none is (a note, not a verdict: the verdict stands on the tests made)."""
    short = []
    for b in benchmarks:
        s, acc = (table.base.summary(b), table.base.acc(b)) if table.base is not None else (None, None)
        if s is None or acc is None or not isinstance(s.n, int):
            continue
        need = mcnemar_items(acc)
        if s.n < need:
            short.append(f"{display(b)} {s.n} items of the {need}")
    if not short:
        return ""
    return (f"; underpowered: {', '.join(short)} that a McNemar test needs to detect a {100 * DETECT:.0f}-point "
            f"change at power {POWER:g}")


def _tests(pairs: Pairs, rows: list[EvalRow], benchmarks: list[str]) -> list[PairedTest]:
    """The item-by-item tests of `rows` on `benchmarks` that the table has."""
    return [pairs[(row.label, b)] for row in rows for b in benchmarks if (row.label, b) in pairs]


def _ci(ci) -> str:
    return f"[{ci[0]:.3g}-{ci[1]:.3g}]"


def _random_note(runs: dict[str, FinetuneResult], table: EvalTable, precise_gain) -> str:
    """Tuning as many random heads is the control for the choice of heads; quoted when it ran (row 9 tests it)."""
    name = next((k for k, v in runs.items() if v.random_heads), None)
    if name is None or precise_gain is None:
        return ""
    seeds = [k for k, v in runs.items() if v.random_heads and seed_free(k) == seed_free(name)]
    rows = [r for r in (table.of_run(k) for k in seeds) if r is not None]
    if len(rows) > 1:
        spread = delta_band(table, rows, table.math())
        return f"; random heads ({seed_free(name)}): {spread.text()}" if spread else ""
    gain = table.mean_delta(rows[0], table.math()) if rows else None
    return f"; random heads ({name}) {SINGLE_DRAW}: {points(gain)}" if gain is not None else ""


def _items(pairs: Pairs, rows: list[EvalRow], benchmarks: list[str]) -> str:
    """'. Item by item against the base row (...): precise — GSM8K +6 / -0, Δ +12.0 [+3.0, +20.4], p 0.031
    (Holm 1); MMLU ...; full — ...'"""
    parts = []
    for row in rows:
        cells = [f"{display(b)} {pairs[(row.label, b)].cell()}" for b in benchmarks if (row.label, b) in pairs]
        if cells:
            parts.append(f"{row.run or row.label} — " + "; ".join(cells))
    if not parts:
        return ". Not tested item by item: no per-item outcomes (eval/<row>/<benchmark>.wrong.jsonl) for these rows"
    return (f". Item by item against the base row (gained / lost, Δ in points [95% CI], exact McNemar p, Holm over "
            f"the table's {len(pairs)} tests): " + "; ".join(parts))


def findings(folder: str | Path | RunFolder) -> list[Finding]:
    """The paper's claims on this run, in the findings table's order, each with its verdict."""
    run = RunFolder.of(folder)
    table = eval_table(run)
    pairs = paired_family(run, table) if table is not None else {}
    math_like_full, drift, faster = precise_sft(run, table, pairs)
    ordered = [few_key_heads(run), where_heads_sit(run), knockout_beyond_random(run), transfer(run),
               attend_operands(run), later_mlps(run), math_like_full, drift, random_place(run, table), faster,
               generic_kept(run, table, pairs)]
    assert [f.row for f in ordered] == list(range(1, 12))
    return ordered

"""Did the paper's claims hold on this model? One verdict per claim, from the numbers the stages wrote.

This module is the one place a claim's verdict is decided. Each rule is fixed here, before any run is seen; a
`Finding` carries the verdict, the evidence quoting the numbers it used (so a reader can redo the call) and the
rule with its test and family. A verdict is one of five (`VERDICTS`):
- holds / does not hold: the rule's conditions are all met / none is;
- partly: some are (for example a gap beyond random that a band of fewer than `MIN_DRAWS` draws cannot confirm);
- not testable: the stage ran, but its numbers cannot decide the claim (nothing to break, nothing moved);
- not measured: the stage that would test it did not run.
One significance criterion holds everywhere: Holm-adjusted exact McNemar p below 0.05 (`stats.ALPHA`) over the
family of every item-by-item test of the run's eval table. A random control decides "holds" only with a band of
at least `MIN_DRAWS` draws.

Where a claim rests on accuracies of the eval table, the evidence also gives each row against the base
row item by item (keyheads.report.stats): items gained / lost, the change in points with its 95%
interval, and the exact McNemar p with Holm's correction over every item-by-item test of the table. A
comparison with one draw of random heads says "(single random draw)".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, get_args

from ..effects import PAPER_THRESHOLD
from ..numbers import human
from ..results.finetune import FinetuneResult
from ..results.knockout import KnockoutResult
from ..runfolder import RunFolder
from .markup import is_num, pct, points
from .rundata import (
    EvalRow,
    EvalTable,
    delta_band,
    display,
    eval_table,
    first_of,
    main_precise,
    paired_family,
    precise_like,
)
from .stats import ALPHA, PairedTest, seed_free

SINGLE_DRAW = "(single random draw)"

FEW_HEADS = 0.10        # "a few percent": at most 10% of all heads are key heads
BEYOND_RANDOM = 0.05    # key-head knockout must cost 5 accuracy points more than random heads (and 2 std)
TRANSFER_GAP = 0.10     # on other formats, key heads must cut 10 points of relative accuracy more than random
GENERIC_KEPT = 0.05     # knocking out key heads may move MMLU/CSQA by at most 5 points
LIKE_FULL = 0.02        # precise SFT's math gain may trail full SFT's by at most 2 points
PAPER_SPEEDUP = 3.0     # the paper: precise SFT trains "at least threefold" faster
MIN_DRAWS = 3           # a random control decides "holds" only as a band of at least this many draws

Verdict = Literal["holds", "partly", "does not hold", "not testable", "not measured"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)


@dataclass(frozen=True)
class Finding:
    """One claim of the paper on one run: its verdict, the numbers behind it and the rule that decided it."""

    claim: str
    verdict: Verdict
    evidence: str
    rule: str = ""  # the test and its family; empty where the claim was not measured
    key: str = ""   # the key numbers, a few words, for a table cell
    row: int = 0    # the claim's row in the findings table (the paper's ten, then keyheads' additions)

    def to_json(self) -> dict:
        return {"row": self.row, "claim": self.claim, "verdict": self.verdict, "key": self.key,
                "evidence": self.evidence, "rule": self.rule}


def _claim(claim: str, verdict: Verdict, evidence: str, rule: str = "", key: str = "") -> Finding:
    return Finding(claim, verdict, evidence, rule, key)


def _of(parts: list[bool]) -> Verdict:
    """holds when every condition is met, does not hold when none is, partly between."""
    return "holds" if all(parts) else "does not hold" if not any(parts) else "partly"


def few_key_heads(run: RunFolder) -> Finding:
    claim = "Only a few percent of the heads are key heads (relative logit change below -5%)"
    eff = run.effects_record
    if eff is None or not eff.heads:
        return _claim(claim, "not measured", "identify did not run")
    if eff.metric != "relative-logit":
        return _claim(claim, "not testable", f"effects are in metric {eff.metric!r}; the -5% rule needs relative-logit")
    values = [v for row in eff.heads for v in row]
    below = sum(1 for v in values if is_num(v) and v < PAPER_THRESHOLD)
    share = below / len(values)
    best = min((v for v in values if is_num(v)), default=float("nan"))
    return _claim(claim, "holds" if 0 < share <= FEW_HEADS else "does not hold",
                  f"{below} of {len(values)} heads ({pct(share)}) are below -5%; the strongest head changes the "
                  f"answer logit by {pct(best)}",
                  f"share of heads past the paper's -5%: holds if more than none and at most {pct(FEW_HEADS, 0)}",
                  f"{below} of {len(values)} heads past -5%; strongest {pct(best)}")


def knockout_beyond_random(run: RunFolder) -> Finding:
    claim = "Knocking out the key heads breaks arithmetic far more than knocking out as many random heads"
    ko = run.knockout_record
    if ko is None:
        return _claim(claim, "not measured", "knockout did not run")
    key = ko.key_heads
    n, before, after = len(key.heads), key.accuracy_before, key.accuracy_after
    rand, std, draws = _random_at(ko, n)
    if rand is None:
        return _claim(claim, "not measured",
                      "no random-head comparison was computed (no curves and no transfer control)")
    if not is_num(before) or before <= 0:
        return _claim(claim, "not testable", "no prompt was answered right before the knockout: nothing to break")
    gap = rand - after
    need = max(BEYOND_RANDOM, 2 * std)
    verdict: Verdict = "does not hold" if gap <= 0 else "holds" if gap >= need and draws >= MIN_DRAWS else "partly"
    return _claim(claim, verdict,
                  f"accuracy {pct(before)} -> {pct(after)} with the {n} key heads out ({ko.mean} mean), "
                  f"{pct(rand)} (std {pct(std)}) "
                  f"with {n} random heads out {_draws(draws)}: {100 * gap:.1f} points lower",
                  f"accuracy with the key heads out against as many random heads: holds if at least "
                  f"{100 * need:.1f} points lower (5 points and 2 std of the band) over a band of at least "
                  f"{MIN_DRAWS} draws; partly if lower by less, or over fewer draws",
                  f"top-{n} {pct(before)} → {pct(after)}; random-{n} {pct(rand)} ({draws} draw{'s' * (draws > 1)})")


def _random_at(ko: KnockoutResult, n: int) -> tuple[float | None, float, int]:
    """Random-head accuracy with n heads out, its std and the number of random draws behind it: the
    random-rank curve at k = n (one draw per seed), else the transfer control (one draw)."""
    curves = ko.curves
    if curves is not None and n in curves.k:
        i = curves.k.index(n)
        return curves.random_mean[i], curves.random_std[i], len(curves.random_rank) or 1
    rows = ko.transfer.rows if ko.transfer is not None else []
    if rows and is_num(rows[0].accuracy_random_heads):
        return rows[0].accuracy_random_heads, 0.0, 1
    return None, 0.0, 0


def _draws(draws: int) -> str:
    return SINGLE_DRAW if draws == 1 else f"(mean of {draws} random draws)"


def transfer(run: RunFolder) -> Finding:
    claim = (
        "The key heads matter on arithmetic in other formats too (SVAMP, multi-digit, decimals), beyond random heads"
    )
    ko = run.knockout_record
    if ko is None or ko.transfer is None or not ko.transfer.rows:
        return _claim(claim, "not measured", "the transfer sets were not run")
    rows = [r for r in ko.transfer.rows[1:] if is_num(r.relative_change) and r.random_draws()]
    if not rows:
        return _claim(claim, "not testable",
                      "no transfer set had right answers before the knockout and a random control")
    bands = [_transfer_band(r.accuracy_before, r.random_draws()) for r in rows]
    wins = [r for r, (mean, std) in zip(rows, bands) if r.relative_change <= mean - max(TRANSFER_GAP, 2 * std)]
    draws = min(len(r.random_draws()) for r in rows)
    shown = "; ".join(f"{r.set}: {pct(r.relative_change)} vs random {pct(mean)} (std {pct(std)})"
                      for r, (mean, std) in zip(rows, bands))
    verdict: Verdict = "does not hold" if not wins else "holds" if 2 * len(wins) > len(rows) and \
        draws >= MIN_DRAWS else "partly"
    return _claim(claim, verdict,
                  f"relative accuracy change with key heads vs random heads out ({ko.mean} mean) {_draws(draws)} — "
                  f"{shown}. The key heads cost at least {100 * TRANSFER_GAP:.0f} points (and 2 std of the band) "
                  f"more on {len(wins)} of {len(rows)} sets",
                  f"per transfer set, the key heads' relative change against the band of random draws: holds if "
                  f"more than half of the sets are {100 * TRANSFER_GAP:.0f} points and 2 std beyond it, over at "
                  f"least {MIN_DRAWS} draws; partly if some are, or over fewer draws; does not hold if none",
                  f"beyond random on {len(wins)} of {len(rows)} sets ({draws} draw{'s' * (draws > 1)})")


def _transfer_band(before: float, draws: list[float]) -> tuple[float, float]:
    """The mean and (population) standard deviation of the control's relative change over its draws."""
    changes = [(a - before) / before for a in draws]
    mean = sum(changes) / len(changes)
    return mean, math.sqrt(sum((c - mean) ** 2 for c in changes) / len(changes))


def generic_kept(run: RunFolder, table: EvalTable | None, pairs: dict[tuple[str, str], PairedTest]) -> Finding:
    claim = "Without the key heads, generic skills (MMLU, CSQA) stay while math drops"
    ko = table.of_kind("knockout") if table else []
    if table is None or not ko or table.base is None or not table.generic():
        return _claim(claim, "not measured",
                      "the evaluation did not include a key-head knockout row and a generic benchmark")
    g = table.mean_delta(ko[0], table.generic())
    m = table.mean_delta(ko[0], table.math())
    if g is None:
        return _claim(claim, "not testable", "no generic benchmark accuracy for both rows")
    # math drops when its mean falls below the generic change and a test tells a loss from chance
    drops = (m is None or m < g) and _significant(pairs, ko[0], table.math(), sign=-1) is not False
    verdict = _of([abs(g) <= GENERIC_KEPT, drops])
    mean = f" ({ko[0].mean} mean)" if ko[0].mean else ""
    return _claim(claim, verdict, f"generic accuracy {points(g)} points, math {points(m)} points with the key heads "
                  f"out{mean}" + _items(pairs, [ko[0]], table.generic() + table.math()),
                  f"mean change against the base row: holds if generic within ±{100 * GENERIC_KEPT:.0f} points "
                  "and math below it with one of its item-by-item tests a significant loss (Holm p < "
                  f"{ALPHA:g}); partly if one of the two",
                  f"generic {points(g)}, math {points(m)} points with the key heads out")


def where_heads_sit(run: RunFolder) -> Finding:
    claim = "The key heads sit in the middle layers"
    keys, eff = run.key_heads_record, run.effects_record
    if keys is None or eff is None or not keys.heads:
        return _claim(claim, "not measured", "identify did not run or took no key heads")
    layers = len(eff.heads)
    lo, hi = layers / 3, 2 * layers / 3  # the paper's 12-17 of 32 lie in the middle third
    inside = sum(lo <= h.layer < hi for h in keys.heads)
    verdict: Verdict = "holds" if 2 * inside >= len(keys.heads) else "partly" if inside else "does not hold"
    span = f"{min(h.layer for h in keys.heads)}-{max(h.layer for h in keys.heads)}"
    return _claim(claim, verdict, f"key heads in layers {span} of {layers}; {inside} of {len(keys.heads)} in the "
                  f"middle third (layers {math.ceil(lo)}-{math.ceil(hi) - 1})",
                  "layers of the key heads: holds if at least half lie in the middle third of the depth (the "
                  "paper's 12-17 of 32 do); partly if some do",
                  f"layers {span} of {layers}; {inside} of {len(keys.heads)} in the middle third")


def attend_operands(run: RunFolder) -> Finding:
    claim = "The key heads attend to the operands and the operator"
    att = run.attention_record
    if att is None or not att.labels:
        return _claim(claim, "not measured", "attention did not run")
    kinds = [l.label for l in att.labels]
    task = sum(1 for k in kinds if k in ("operand", "operator"))
    verdict: Verdict = "holds" if 2 * task >= len(kinds) else "partly" if task else "does not hold"
    return _claim(claim, verdict,
                  f"{kinds.count('operand')} operand-, {kinds.count('operator')} operator- and {kinds.count('text')} "
                  f"text-attending of {len(kinds)} key heads",
                  "heads labelled by where their attention goes: holds if at least half attend to operands or "
                  "operators; partly if some do",
                  f"{kinds.count('operand')} operand and {kinds.count('operator')} operator heads of {len(kinds)}")


def later_mlps(run: RunFolder) -> Finding:
    claim = "Later MLPs compute the answer (after the layers that gather the operands)"
    mlp = run.mlp_record
    if mlp is None:
        return _claim(claim, "not measured", "mlp did not run")
    tp, c = mlp.turning_points, mlp.answer_contrast
    layers = len(c)
    end = tp.end
    peak = c[end] if 0 <= end < layers else float("nan")
    positive = is_num(peak) and peak > 0
    verdict: Verdict = _of([end >= tp.inflection, 2 * end >= layers - 1]) if positive else "does not hold"
    if verdict == "does not hold" and positive:
        verdict = "partly"
    return _claim(claim, verdict, f"start-inflection-end {tp.text()} of {layers} layers; "
                  f"answer contrast at the end layer {peak:.3g}",
                  "the answer contrast of the MLP writes: holds if positive at the end layer, at or after the "
                  "inflection, in the later half; partly if positive but not both; does not hold if not positive",
                  f"start-inflection-end {tp.text()} of {layers}; contrast {peak:.3g}")


def precise_sft(run: RunFolder, table: EvalTable | None, pairs: dict[tuple[str, str], PairedTest]) -> list[Finding]:
    claims = ("Precise SFT of the key heads improves math about as much as full SFT",
              "Precise SFT moves generic skills (MMLU, CSQA) less than full SFT",
              "Precise SFT trains faster than full SFT, with far fewer tuned parameters")
    runs = run.finetune_records
    p, f = main_precise(runs), first_of(runs, "full")
    if p is None or f is None:
        why = "precise and full SFT did not both run"
        return [_claim(c, "not measured", why) for c in claims]
    out = []
    prow, frow = (table.of_run(p), table.of_run(f)) if table else (None, None)
    if table is None or prow is None or frow is None or table.base is None:
        out += [_claim(c, "not measured", "the fine-tuned variants were not evaluated") for c in claims[:2]]
    else:
        pm, fm = table.mean_delta(prow, table.math()), table.mean_delta(frow, table.math())
        extra = _random_note(runs, table, pm)
        verdict7 = _matches_full(pm, fm, _moved(pairs, [prow, frow], table.math()),
                                 _significant(pairs, prow, table.math()))
        out.append(_claim(claims[0], verdict7,
                          f"math accuracy {points(pm)} points with {p}, {points(fm)} with {f}{extra}"
                          + _items(pairs, [prow, frow], table.math()),
                          f"mean math change against the base row: holds if a gain within {100 * LIKE_FULL:.0f} "
                          "points of full SFT's; partly if it trails by more but one of precise SFT's own "
                          "item-by-item tests is a significant gain; does not hold if it trails by more with none; "
                          "not testable if neither "
                          "gains, or no item-by-item test of either row is significant (Holm p < "
                          f"{ALPHA:g} over the table's family)",
                          f"math {points(pm)} ({p}) vs {points(fm)} ({f}) points"))
        pg, fg = table.mean_delta(prow, table.generic()), table.mean_delta(frow, table.generic())
        dp, df = table.drift(prow), table.drift(frow)
        if dp is not None and df is not None and dp.kl is not None and df.kl is not None:
            # the drift measure can show a loss where chance-level accuracies cannot
            cp, cf = dp.kl_ci95 or [math.nan, math.nan], df.kl_ci95 or [math.nan, math.nan]
            overlap = cp[1] >= cf[0] and cf[1] >= cp[0]
            verdict: Verdict = "does not hold" if dp.kl > df.kl else "partly" if overlap else "holds"
            out.append(_claim(claims[1], verdict,
                              f"KL from the base model on generic text {dp.kl:.4g} {_ci(cp)} with {p}, "
                              f"{df.kl:.4g} {_ci(cf)} with {f}"
                              + (" (the intervals overlap: within the noise)" if overlap else "")
                              + f"; generic accuracy {points(pg)} vs {points(fg)} points",
                              "KL from the base model on generic text with its 95% interval: holds if precise "
                              "SFT's is smaller and the intervals do not overlap; partly if smaller within them",
                              f"KL {dp.kl:.3g} ({p}) vs {df.kl:.3g} ({f})"))
        else:
            verdict = "not testable" if pg is None or fg is None else \
                "holds" if abs(pg) <= abs(fg) else "does not hold"
            out.append(_claim(claims[1], verdict, f"generic accuracy {points(pg)} points with {p}, {points(fg)} "
                              f"with {f}" + _items(pairs, [prow, frow], table.generic()),
                              "mean generic change against the base row (no KL measured): holds if precise SFT's "
                              "is the smaller", f"generic {points(pg)} ({p}) vs {points(fg)} ({f}) points"))
    sp, sf = runs[p].train.samples_per_second, runs[f].train.samples_per_second
    tp, tf = runs[p].tuned_params, runs[f].tuned_params
    if not (is_num(sp) and is_num(sf)) or sf <= 0:
        out.append(_claim(claims[2], "not measured", "training speed was not recorded"))
        return out
    ratio = sp / sf
    fewer = not is_num(tp) or not is_num(tf) or tp < tf
    verdict = "holds" if ratio >= PAPER_SPEEDUP and fewer else "partly" if ratio > 1 and fewer else "does not hold"
    out.append(_claim(claims[2], verdict, f"{sp:.3g} vs {sf:.3g} samples/s ({ratio:.2f}x), {human(tp)} vs "
                      f"{human(tf)} tuned parameters ({p} vs {f})",
                      f"samples per second in the same run: holds if at least {PAPER_SPEEDUP:g}x (the paper's "
                      "\"at least threefold\") with fewer tuned parameters; partly if faster by less",
                      f"{sp:.3g} vs {sf:.3g} samples/s ({ratio:.2f}x)"))
    return out


def _matches_full(pm: float | None, fm: float | None, moved: bool | None, gains: bool | None) -> Verdict:
    """Claim 7's rule on the mean math changes of precise and full SFT; moved: whether any item-by-item test of
    the two rows is significant; gains: whether one of precise SFT's is a significant gain (both None when no
    per-item outcomes were saved). A smaller mean gain that no test tells from zero is no gain: one
    significance criterion for every claim."""
    if pm is None or fm is None:
        return "not measured"
    if (pm <= 0 and fm <= 0) or moved is False:
        return "not testable"
    if pm <= 0:
        return "does not hold"
    if pm >= fm - LIKE_FULL:
        return "holds"
    return "does not hold" if gains is False else "partly"


def _significant(pairs: dict[tuple[str, str], PairedTest], row: EvalRow, benchmarks: list[str],
                 sign: int = 1) -> bool | None:
    """Whether one of `row`'s item-by-item tests on `benchmarks` is significant in the direction `sign` (+1 a
    gain, -1 a loss); None when no per-item outcomes were saved."""
    tests = _tests(pairs, [row], benchmarks)
    return any(t.significant and sign * t.delta > 0 for t in tests) if tests else None


def _moved(pairs: dict[tuple[str, str], PairedTest], rows: list[EvalRow], benchmarks: list[str]) -> bool | None:
    tests = _tests(pairs, rows, benchmarks)
    return any(t.significant for t in tests) if tests else None


def _tests(pairs: dict[tuple[str, str], PairedTest], rows: list[EvalRow], benchmarks: list[str]) -> list[PairedTest]:
    """The item-by-item tests of `rows` on `benchmarks` that the table has."""
    return [pairs[(row.label, b)] for row in rows for b in benchmarks if (row.label, b) in pairs]


def random_place(run: RunFolder, table: EvalTable | None, pairs: dict[tuple[str, str], PairedTest]) -> Finding:
    claim = "The key heads are a better place to fine-tune than as many random heads"
    runs = run.finetune_records
    name = next((k for k, v in runs.items() if v.random_heads), None)
    p = precise_like(runs, name) if name is not None else None
    if name is not None and p is None:
        return _claim(claim, "not measured", f"no precise SFT run tunes as many heads and MLPs as {name}")
    if p is None or name is None or table is None or table.base is None or table.of_run(p) is None:
        return _claim(claim, "not measured", "precise SFT and SFT of random heads were not both run and evaluated")
    seeds = [k for k, v in runs.items() if v.random_heads and seed_free(k) == seed_free(name)]
    rows = [r for r in (table.of_run(k) for k in seeds) if r is not None]
    prow = table.of_run(p)
    pm = table.mean_delta(prow, table.math()) if prow is not None else None
    draws = [d for d in (table.mean_delta(r, table.math()) for r in rows) if d is not None]
    if pm is None or not draws or prow is None:
        return _claim(claim, "not measured", "no math accuracy for precise SFT and the random heads")
    moved = _moved(pairs, [prow, *rows], table.math())
    best, mean = max(draws), sum(draws) / len(draws)
    verdict: Verdict = ("not testable" if moved is False else "does not hold" if pm <= mean
                        else "holds" if pm > best and len(draws) >= MIN_DRAWS else "partly")
    return _claim(claim, verdict,
                  f"mean math change {points(pm)} points with {p}; {seed_free(name)} over {len(draws)} draw(s): "
                  f"mean {points(mean)}, best {points(best)}" + _items(pairs, [prow, *rows], table.math()),
                  f"mean math change against the base row, precise SFT against random heads of the same number "
                  f"(heads and MLPs): holds if precise SFT's is above every one of at least "
                  f"{MIN_DRAWS} random draws; partly if above their mean only, or over fewer draws; not testable if "
                  f"no item-by-item test of these rows is significant (Holm p < {ALPHA:g})",
                  f"math {points(pm)} ({p}) vs random mean {points(mean)}, best {points(best)} ({len(draws)} draws)")


def _ci(ci) -> str:
    return f"[{ci[0]:.3g}-{ci[1]:.3g}]"


def _random_note(runs: dict[str, FinetuneResult], table: EvalTable, precise_gain) -> str:
    """Tuning as many random heads is the control for the choice of heads; quoted when it ran: one run is
    one random draw; several seeds of it (random@K, random@K-seed1, ...) give a band."""
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


def _items(pairs: dict[tuple[str, str], PairedTest], rows: list[EvalRow], benchmarks: list[str]) -> str:
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
    """The paper's claims on this run, in its order, each with its verdict."""
    run = RunFolder.of(folder)
    table = eval_table(run)
    pairs = paired_family(run, table) if table is not None else {}
    math_like_full, drift, faster = precise_sft(run, table, pairs)
    # in the order of the findings table: the paper's ten claims, then keyheads' additions
    ordered = [few_key_heads(run), where_heads_sit(run), knockout_beyond_random(run), transfer(run),
               attend_operands(run), later_mlps(run), math_like_full, drift, random_place(run, table, pairs), faster,
               generic_kept(run, table, pairs)]
    return [replace(f, row=i) for i, f in enumerate(ordered, 1)]

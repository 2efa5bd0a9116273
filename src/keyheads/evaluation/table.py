"""The paper's table 1: one row per variant, accuracy and its change from the first row per benchmark."""
from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from ..results.evaluation import BenchmarkSummary, VariantResult
from .settings import DRIFT, display  # DRIFT's summaries have "kl" and "perplexity" instead of an accuracy


def _drift_cells(s: BenchmarkSummary | None) -> list[str]:
    if s is None:
        return ["-", "-"]
    kl, _, ppl, _ = s.drift()
    return [f"{kl:.4f}", f"{ppl:.2f}"]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _delta(x: float | None, ref: float | None) -> str:
    if x is None or ref is None:
        return "-"
    return f"{100 * (x - ref):+.1f}"


def _accuracy(res: VariantResult | None, benchmark: str) -> float | None:
    s = res.on(benchmark) if res is not None else None
    return s.accuracy if s is not None else None


def table_rows(results: Sequence[VariantResult], benchmarks: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """One row per result, the first the reference of the Δ columns."""
    header = ["Model", "Train speed", "Tuned params"]
    for b in benchmarks:
        if b == DRIFT:
            header += [f"{display(b)} KL", f"{display(b)} PPL"]
        else:
            header += [f"{display(b)} Acc.", f"{display(b)} Δ"]
    ref = results[0] if results else None
    rows = []
    for i, res in enumerate(results):
        row = [res.label, str(res.info.train_speed or "-"), str(res.info.tuned_params or "-")]
        for b in benchmarks:
            if b == DRIFT:
                row += _drift_cells(res.on(b))
                continue
            acc = _accuracy(res, b)
            row += [_pct(acc), "-" if i == 0 else _delta(acc, _accuracy(ref, b))]
        rows.append(row)
    return header, rows


def to_markdown(results: Sequence[VariantResult], benchmarks: Sequence[str]) -> str:
    header, rows = table_rows(results, benchmarks)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    detail = [
        "",
        "| Model | Benchmark | Split | n | Correct | Acc. % | 95% CI (Wilson) |",
        "|---|---|---|---|---|---|---|",
    ]
    drift = ["", "| Model | Drift measure | Texts | n | Tokens | KL from the first row [95% CI] | "
             "Perplexity [95% CI] |", "|---|---|---|---|---|---|---|"]
    for res in results:
        for b in benchmarks:
            s = res.on(b)
            if s is not None and b == DRIFT:
                kl, (kl_lo, kl_hi), ppl, (ppl_lo, ppl_hi) = s.drift()
                drift.append(f"| {res.label} | {b} | {s.split} | {s.n} | {s.tokens} | {kl:.4f} "
                             f"[{kl_lo:.4f}-{kl_hi:.4f}] | {ppl:.2f} [{ppl_lo:.2f}-{ppl_hi:.2f}] |")
            elif s is not None:
                acc, (lo, hi) = s.scored()
                detail.append(f"| {res.label} | {display(b)} | {s.split} | {s.n} | {s.correct} | "
                              f"{100 * acc:.1f} | {100 * lo:.1f}-{100 * hi:.1f} |")
    return "\n".join(lines + detail + (drift if len(drift) > 3 else [])) + "\n"


def to_csv(results: Sequence[VariantResult], benchmarks: Sequence[str]) -> str:
    """Numbers unrounded: accuracy and delta as fractions, plus n and the CI bounds."""
    header = ["model", "train_speed", "tuned_params"]
    for b in benchmarks:
        if b == DRIFT:
            header += [f"{b}_kl", f"{b}_kl_ci_low", f"{b}_kl_ci_high", f"{b}_ppl", f"{b}_n"]
        else:
            header += [f"{b}_acc", f"{b}_delta", f"{b}_n", f"{b}_ci_low", f"{b}_ci_high"]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    ref = results[0] if results else None
    for i, res in enumerate(results):
        row: list[object] = [res.label, res.info.train_speed or "-", res.info.tuned_params or "-"]
        for b in benchmarks:
            s = res.on(b)
            if s is None:
                row += ["-"] * 5
                continue
            if b == DRIFT:
                kl, (kl_lo, kl_hi), ppl, _ = s.drift()
                row += [f"{kl:.6g}", f"{kl_lo:.6g}", f"{kl_hi:.6g}", f"{ppl:.6g}", s.n]
                continue
            base = _accuracy(ref, b)
            acc, (lo, hi) = s.scored()
            delta = "-" if i == 0 or base is None else f"{acc - base:.6f}"
            row += [f"{acc:.6f}", delta, s.n, f"{lo:.6f}", f"{hi:.6f}"]
        writer.writerow(row)
    return buf.getvalue()

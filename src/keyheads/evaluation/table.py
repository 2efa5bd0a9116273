"""The paper's table 1: one row per variant, accuracy and its change from the first row per benchmark."""
from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from .settings import DISPLAY, DRIFT  # DRIFT's summaries have "kl" and "perplexity" instead of an accuracy


def _drift_cells(s: dict | None) -> list[str]:
    if not s:
        return ["-", "-"]
    return [f"{s['kl']:.4f}", f"{s['perplexity']:.2f}"]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _delta(x: float | None, ref: float | None) -> str:
    if x is None or ref is None:
        return "-"
    return f"{100 * (x - ref):+.1f}"


def table_rows(results: Sequence[dict], benchmarks: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """results: [{"label", "info", "benchmarks": {name: {"accuracy", ...}}}]; the first is the reference."""
    header = ["Model", "Train speed", "Tuned params"]
    for b in benchmarks:
        if b == DRIFT:
            header += [f"{DISPLAY.get(b, b)} KL", f"{DISPLAY.get(b, b)} PPL"]
        else:
            header += [f"{DISPLAY.get(b, b)} Acc.", f"{DISPLAY.get(b, b)} Δ"]
    ref = results[0]["benchmarks"] if results else {}
    rows = []
    for i, res in enumerate(results):
        info = res.get("info") or {}
        row = [res["label"], str(info.get("train_speed") or "-"), str(info.get("tuned_params") or "-")]
        for b in benchmarks:
            if b == DRIFT:
                row += _drift_cells(res["benchmarks"].get(b))
                continue
            acc = res["benchmarks"].get(b, {}).get("accuracy")
            base = ref.get(b, {}).get("accuracy")
            row += [_pct(acc), "-" if i == 0 else _delta(acc, base)]
        rows.append(row)
    return header, rows


def to_markdown(results: Sequence[dict], benchmarks: Sequence[str]) -> str:
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
            s = res["benchmarks"].get(b)
            if s and b == DRIFT:
                (kl, kh), (pl, ph) = s["kl_ci95"], s["perplexity_ci95"]
                drift.append(f"| {res['label']} | {b} | {s['split']} | {s['n']} | {s['tokens']} | {s['kl']:.4f} "
                             f"[{kl:.4f}-{kh:.4f}] | {s['perplexity']:.2f} [{pl:.2f}-{ph:.2f}] |")
            elif s:
                lo, hi = s["ci95"]
                detail.append(f"| {res['label']} | {DISPLAY.get(b, b)} | {s['split']} | {s['n']} | {s['correct']} | "
                              f"{100 * s['accuracy']:.1f} | {100 * lo:.1f}-{100 * hi:.1f} |")
    return "\n".join(lines + detail + (drift if len(drift) > 3 else [])) + "\n"


def to_csv(results: Sequence[dict], benchmarks: Sequence[str]) -> str:
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
    ref = results[0]["benchmarks"] if results else {}
    for i, res in enumerate(results):
        info = res.get("info") or {}
        row = [res["label"], info.get("train_speed") or "-", info.get("tuned_params") or "-"]
        for b in benchmarks:
            s = res["benchmarks"].get(b)
            if not s:
                row += ["-"] * 5
                continue
            if b == DRIFT:
                row += [f"{s['kl']:.6g}", f"{s['kl_ci95'][0]:.6g}", f"{s['kl_ci95'][1]:.6g}", f"{s['perplexity']:.6g}",
                        s["n"]]
                continue
            base = ref.get(b, {}).get("accuracy")
            delta = "-" if i == 0 or base is None else f"{s['accuracy'] - base:.6f}"
            row += [f"{s['accuracy']:.6f}", delta, s["n"], f"{s['ci95'][0]:.6f}", f"{s['ci95'][1]:.6f}"]
        writer.writerow(row)
    return buf.getvalue()

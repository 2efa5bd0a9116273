"""Section 6: the paper's tables 1 and 2 and the training curves, from eval/ and finetune/*/."""
from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup

from ..components import Components
from ..evaluation.settings import display
from ..numbers import human
from ..plotting import loss_curves, png_bytes
from ..results.finetune import FinetuneResult
from ..runfolder import FINETUNE_JSON, RunFolder
from .findings import Finding
from .markup import MACROS, cell, heading, is_num, join, not_run, note, num, pct, png, points, section, table
from .rundata import DRIFT, EvalRow, EvalTable, delta_band, eval_table, paired_family, precise_runs, seed_sets

TITLE = "6. Improving the model: precise SFT vs full SFT (tables 1 and 2)"


def _speed(info: FinetuneResult | None):
    value = info.train.samples_per_second if info is not None else None
    return cell(value, f"{value:.3g} sam./s" if is_num(value) else "–")


def _params(info: FinetuneResult | None):
    value = info.tuned_params if info is not None else None
    return cell(value, human(value))


def _interval(values: list | None) -> tuple:
    """An interval's (low, high), (None, None) when it was not saved."""
    return (values[0], values[1]) if values is not None and len(values) >= 2 else (None, None)


def _drift(row: EvalRow) -> list:
    s = row.summary(DRIFT)
    kl, ppl = (s.kl, s.perplexity) if s is not None else (None, None)
    lo, hi = _interval(s.kl_ci95 if s is not None else None)
    shown = (f"{kl:.4f}" + (f" [{lo:.4f}–{hi:.4f}]" if is_num(lo) and is_num(hi) else "")) if is_num(kl) else "–"
    return [cell(kl, shown), cell(ppl, f"{ppl:.2f}" if is_num(ppl) else "–")]


def _acc(row: EvalRow, base: EvalRow | None, bench: str) -> list:
    if bench == DRIFT:  # KL from the base row and perplexity, not an accuracy
        return _drift(row)
    s = row.summary(bench)
    acc = row.acc(bench)
    lo, hi = _interval(s.ci95 if s is not None else None)
    shown = pct(acc) + (f" [{100 * lo:.1f}–{100 * hi:.1f}]" if is_num(lo) and is_num(hi) else "")
    ref = base.acc(bench) if base is not None and base is not row else None
    delta = acc - ref if acc is not None and ref is not None else None
    return [cell(acc, shown), cell(delta, points(delta))]


def _n(row: EvalRow, bench: str) -> object:
    s = row.summary(bench)
    return s.n if s is not None and s.n is not None else "?"


def table1(t: EvalTable, runs: dict[str, FinetuneResult]) -> Markup:
    header = ["Model", "Kind", "Train speed", "Tuned params"]
    for b in t.benchmarks:
        header += (["Generic KL [95% CI]", "Generic PPL"] if b == DRIFT
                   else [f"{display(b)} Acc. % [95% CI]", f"{display(b)} Δ"])
    rows = []
    for r in t.rows:
        info = runs[r.run] if r.run in runs else None
        kind = r.kind + (f" ({r.run})" if r.run else "") + (f" ({r.mean} mean)" if r.mean else "")
        row = [r.label, kind, _speed(info), _params(info)]
        for b in t.benchmarks:
            row += _acc(r, t.base, b)
        rows.append(row)
    n = ", ".join(f"{display(b)} n={_n(t.base, b)}" for b in t.benchmarks) if t.base else ""
    added = (" A knockout row is keyheads' addition: the paper's table 1 has none (its knockouts are figures 3 "
             "and 4)." if any(r.kind == "knockout" for r in t.rows) else "")
    return join([heading("Table 1: accuracy of every evaluated variant"),
                 note(f"Δ: percentage points from {t.base.label if t.base else 'the first row'}. {n}.{added}"),
                 table(header, rows, "table1")], "")


def item_by_item(run: RunFolder, t: EvalTable) -> Markup:
    """Each row against the base row on the same items (keyheads.report.stats), where the rows wrote the
    items they got wrong; the seeds of a random control, when several ran, as a band."""
    pairs = paired_family(run, t)
    if not pairs:
        return Markup()
    benches = [b for b in t.scored() if any(k[1] == b for k in pairs)]
    rows = []
    for r in t.rows:
        if r is t.base or not any((r.label, b) in pairs for b in benches):
            continue
        tests = [pairs[(r.label, b)] if (r.label, b) in pairs else None for b in benches]
        named = r.label if not r.mean or f"{r.mean} mean" in r.label else f"{r.label} ({r.mean} mean)"
        rows.append([named] + [cell(x.p_holm, x.cell()) if x else cell(None) for x in tests])
    for name, seeds in seed_sets([r for r in t.rows if r is not t.base]):
        spreads = [delta_band(t, seeds, [b]) for b in benches]
        rows.append([f"{name}: {len(seeds)} seeds"] + [cell(s.mean, s.text()) if s else cell(None) for s in spreads])
    return join([heading("Item by item against the base row"),
                 note(f"Items gained / lost against {t.base.label if t.base else 'the base row'} on the same items; "
                      "Δ: the change in points with its 95% interval for paired proportions (Newcombe, method 10); "
                      "two-sided exact McNemar p, and in brackets the p adjusted by Holm's method over all "
                      f"{len(pairs)} tests of this table. A change counts only when the Holm p is below 0.05."),
                 table(["Variant"] + [display(b) for b in benches], rows, "pairs")], "")


def table2(t: EvalTable | None, runs: dict[str, FinetuneResult]) -> Markup:
    """The ablation over how many heads (and which MLPs) precise SFT tunes; only when it ran."""
    chosen = precise_runs(runs)
    if len(chosen) < 2:
        return Markup()
    benches = t.benchmarks if t else []
    rows = []
    for name, info in sorted(chosen.items(), key=lambda kv: (len(_components(kv[1]).heads),
                                                              len(_components(kv[1]).mlps))):
        comp = _components(info)
        setting = f"{len(comp.heads)} heads" + (f" + MLPs {list(comp.mlps)}" if comp.mlps else "")
        row = [name, setting, _speed(info), _params(info)]
        er = t.of_run(name) if t else None
        for b in benches:
            row += _acc(er, t.base, b) if er and t else [cell(None), cell(None)]
        rows.append(row)
    header = ["Variant", "Precise SFT setting", "Train speed", "Tuned params"]
    for b in benches:
        header += ["Generic KL", "Generic PPL"] if b == DRIFT else [f"{display(b)} Acc. %", f"{display(b)} Δ"]
    return join([heading("Table 2: ablation over the tuned components"), table(header, rows, "table2")], "")


def _components(info: FinetuneResult) -> Components:
    return info.components if info.components is not None else Components()


def training(runs: dict[str, FinetuneResult]) -> Markup:
    rows, losses = [], {}
    for name, info in runs.items():
        tr, comp = info.train, info.components
        rows.append(
            [
                name,
                info.method,
                comp.source if comp is not None else "all" if info.method == "full" else "–",
                cell(tr.steps, str(tr.steps)),
                _speed(info),
                _params(info),
                cell(info.total_params, human(info.total_params)),
                cell(tr.final_loss, num(tr.final_loss, ".4f")),
                cell(tr.seconds_this_run, num(tr.seconds_this_run, ".1f")),
            ]
        )
        losses[name] = tr.losses
    return join([heading("Training runs"),
                 table(["variant", "method", "components", "steps", "speed", "tuned params", "of total",
                        "final loss", "seconds"], rows, "training"),
                 heading("Training loss per optimizer step"), _loss_figure(losses)], "")


def _loss_figure(losses: dict[str, list]) -> Markup:
    """Drawn here (the runs wrote numbers, not a figure) and inlined like the stages' figures."""
    fig = loss_curves({k: [float(v) for v in vs if is_num(v)] for k, vs in losses.items()})
    if fig is None:
        return note("no values to plot")
    return png(png_bytes(fig), "training loss per optimizer step of each fine-tuning run", "training losses")


def improve(run: RunFolder) -> Markup:
    runs = run.finetune_records
    t = eval_table(run)
    parts = []
    if t is not None:
        parts += [table1(t, runs), item_by_item(run, t)]
        if not runs:
            parts.append(
                note("No fine-tuned variant in this run: the table has the base model (and the knockout) only.")
            )
    else:
        parts.append(not_run("eval", RunFolder.EVAL_RESULTS))
    if runs:
        parts += [table2(t, runs), training(runs)]
    elif t is None:
        parts.append(not_run("finetune", f"{RunFolder.FINETUNE}/*/{FINETUNE_JSON}"))
    return section("improve", TITLE, join(parts))


def findings_section(items: list[Finding], skipped: Sequence[Finding] = (), task: str = "") -> Markup:
    css = {"holds": "held", "partly": "partly", "does not hold": "failed", "not testable": "untested",
           "not measured": "untested"}
    shown = [{"claim": f.claim, "evidence": f"{f.evidence}. Rule (v{f.version}): {f.rule}" if f.rule else f.evidence,
              "badge": f.verdict, "cls": css[f.verdict]} for f in items]
    notes = [note("Each claim is decided by a rule fixed before the data (stated in the evidence, with the "
                  "version of keyheads' rules it was judged under) on this run's numbers. "
                  "Where it rests on accuracies, the evidence gives each row against the base row item "
                  "by item: items gained / lost, the change Δ in points with its 95% interval, and the "
                  "exact McNemar p with Holm's correction over every item-by-item test of the eval "
                  "table. A comparison with one draw of random heads says so.")]
    if skipped:
        rows = ", ".join(str(f.row) for f in skipped)
        notes.append(note(f"This run's task is {task!r}: claims {rows} of the paper's findings table are skipped, "
                          "since they are about the paper's own task and its benchmarks (other formats of the "
                          "task, the operands and the operator, the MLPs' computed answer, math gains, and "
                          "MMLU and CSQA beside math)."))
    return section("findings", "7. Findings: did the paper's claims hold on this model?",
                   join([*notes, MACROS.findings(shown)], ""))

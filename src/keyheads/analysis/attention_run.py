"""The attention step: where the key heads look from END, by token role, with labels and heatmaps."""
from __future__ import annotations

from pathlib import Path

from ..io import write_json
from ..log import logger
from ..models.model import HookedModel
from ..plotting import write_csv
from ..results.attention import AttentionResult, HeadEffect
from ..runfolder import ATTENTION_JSON
from ..selection import HeadChoice, Notes, choose_heads
from . import attention as att
from . import transfer as tr
from .common import AnalysisError, load_samples
from .settings import AttentionSettings


def run_attention(model: HookedModel, pairs: str | Path, out: str | Path, heads: HeadChoice,
                  settings: AttentionSettings, *, batch_size: int = 16, progress: bool = True) -> AttentionResult:
    """Where `heads` look from END on the pairs file `pairs` (it needs positions), written into `out`."""
    data, out = str(pairs), Path(out)
    notes = Notes()
    chosen, effects = choose_heads(model, heads)
    samples = load_samples(model, data, settings.limit, settings.seed)
    missing = sum(1 for s in samples if not s.positions)
    if missing:
        raise AnalysisError(f"{data}: {missing} of {len(samples)} pairs have no 'positions' (token indices of A, "
                            "B and the operator); attention by token role needs them - regenerate the file with "
                            "`keyheads data`, which writes them")
    rows = att.end_attention(model, [s.prompt for s in samples], chosen, batch_size, progress)
    roles = att.by_role(rows, samples)                                    # [n, heads, 5]
    tasks = sorted({s.task for s in samples})
    per_task = {t: roles[[i for i, s in enumerate(samples) if s.task == t]].mean(0) for t in tasks}
    counts = {t: sum(1 for s in samples if s.task == t) for t in tasks}
    labels = att.label_heads(chosen, roles.mean(0))
    top_other = att.top_other_tokens(model, rows, samples)
    att.plot_by_role(per_task, counts, chosen, labels, out / "attention_by_role.png")

    # figure 16-style: END rows on one prompt per task; figure 7: the figure-4 formats the heads never saw
    cases = [(f"{t} ({next(s.template for s in samples if s.task == t)})", next(s.prompt for s in samples
                                                                             if s.task == t)) for t in tasks]
    unseen = [(ts.name, ts.prompts[0]) for ts in (make(model, 1) for make in (tr.multidigit, tr.decimal, tr.year_span))]
    for group, name in ((cases, "attention_cases.png"), (unseen, "attention_transfer_cases.png")):
        group_rows = att.end_attention(model, [p for _, p in group], chosen, progress=False)
        att.plot_cases(model, group, group_rows, chosen, out / name)
    # figure 16: the full pattern of the strongest operator head and operand head
    drawn = []
    for kind in ("operator", "operand"):
        best = max((l for l in labels if l.label == kind), default=None,
                   key=lambda l: l.operator if kind == "operator" else l.operand_A_plus_B)
        if best is None:
            continue
        task_cases = cases[:4]
        pats = att.full_patterns(model, [p for _, p in task_cases], best.head)
        name = f"attention_pattern_{best.head}.png"
        att.plot_patterns(model, task_cases, pats, best.head, kind, out / name)
        drawn.append(name)

    csv_rows = []
    for t in tasks + ["all"]:
        m = roles.mean(0) if t == "all" else per_task[t]
        for h, lab, vals in zip(chosen, labels, m):
            csv_rows.append([t, str(h), lab.label, *[float(v) for v in vals]])
    write_csv(out / "attention_by_role.csv", ["task", "head", "label", *att.ROLES], csv_rows)
    for lab, top in zip(labels, top_other):
        lab.top_other_tokens = top
    result = AttentionResult(
        model=model.name, data=data, n_samples=len(samples), heads=chosen, roles=list(att.ROLES),
        per_task={t: per_task[t].tolist() for t in tasks}, counts=counts, all=roles.mean(0).tolist(), labels=labels,
        effects=[HeadEffect(layer=h.layer, head=h.head, effect=effects.effect(h)) for h in chosen] if effects else None,
        notes=list(notes))
    write_json(out / ATTENTION_JSON, result.to_json())
    logger.info("wrote %s/%s, attention_by_role.csv, attention_by_role.png, attention_cases.png, "
                "attention_transfer_cases.png%s", out, ATTENTION_JSON, "".join(f", {d}" for d in drawn))
    return result


def describe(result: AttentionResult) -> str:
    """Where the heads look, for people: each head's mean END attention by token role and its label."""
    counts = result.counts
    lines = [f"{result.model}: END-token attention of {len(result.heads)} key heads over "
             f"{result.n_samples} reference prompts ({', '.join(f'{t}: {n}' for t, n in counts.items())})",
             f"{'head':<7} {'label':<9} {'lean':<9} " + " ".join(f"{att.ROLE_NAMES[r]:>11}" for r in att.ROLES)
             + "  most-attended other tokens"]
    for lab, vals in zip(result.labels, result.all):
        lines.append(f"{str(lab.head):<7} {lab.label:<9} {lab.lean:<9} "
                     + " ".join(f"{v:>11.3f}" for v in vals) + "  "
                     + ", ".join(f"{t} {v:.2f}" for t, v in lab.top_other_tokens))
    return "\n".join(lines)

"""The analysis sections, one function each, in the paper's figure order (figures 2 to 6; the sets identified
apart, figure 15 and appendices D and E, after the main identification).

Each takes the run folder and returns HTML; a stage that left nothing behind gives a one-line
"did not run" note, never an exception.
"""
from __future__ import annotations

from collections.abc import Iterable

from markupsafe import Markup

from ..components import rule_text
from ..heads import Head
from ..results.knockout import Case
from ..runfolder import ATTENTION_JSON, KNOCKOUT_JSON, MLP_JSON, RunFolder
from . import rundata
from .markup import (
    MACROS,
    bullet_list,
    cell,
    figures,
    heading,
    img,
    is_num,
    join,
    not_run,
    note,
    num,
    para,
    pct,
    section,
    side_by_side,
    signed_pct,
    table,
)


def _effect(value, metric: str | None):
    """Relative-logit effects read as percentages (the paper's -5%); other metrics as numbers."""
    shown = signed_pct(value, 2) if metric == "relative-logit" else num(value, "+.4g")
    return cell(value, shown)


def identify(run: RunFolder) -> Markup:
    folder = run.identify
    keys, eff = run.key_heads_record, run.effects_record
    title = "1. Which heads matter: path-patching effects (figure 2)"
    if keys is None:
        return section("identify", title, not_run("identify", RunFolder.KEY_HEADS))
    metric = keys.metric
    sem = eff.heads_sem if eff is not None else []
    method, n, excluded = (eff.method, eff.n_samples, eff.n_excluded) if eff is not None else ("?", "?", 0)
    intro = (f"{method} patching, metric {metric}, over {n} prompts ({excluded} excluded). Key heads: "
             f"{len(keys.heads)} of {keys.n_heads_total}, chosen as {rule_text(keys.threshold, keys.top_k)}.")
    rows = []
    for i, k in enumerate(keys.heads):
        l, h = k.layer, k.head
        s = sem[l][h] if l < len(sem) and h < len(sem[l]) else None
        rows.append(
            [
                cell(i + 1, str(i + 1)),
                k.label,
                cell(l, str(l)),
                cell(h, str(h)),
                _effect(k.effect, metric),
                cell(s, num(s, ".2g")),
            ]
        )
    body = [note(intro), figures(folder, [("heatmap.png", "effect of patching each head and MLP"),
                                       ("faithfulness.png", "MIB faithfulness of circuits of the top heads and MLPs "
                                        "(keyheads faithfulness)")]),
            heading("Key heads"), table(["rank", "head", "layer", "index", "effect", "s.e.m."], rows, "key-heads")]
    mlps = eff.mlps if eff is not None else []
    if mlps:
        ranked = sorted(range(len(mlps)), key=lambda l: mlps[l] if is_num(mlps[l]) else 0.0)[:5]
        body += [heading("Strongest MLPs"),
                 table(["MLP layer", "effect"], [[cell(l, str(l)), _effect(mlps[l], metric)] for l in ranked])]
    return section("identify", title, join(body))


def identified_sets(run: RunFolder) -> Markup:
    """The identify/NAME sets (a run's also_identify) beside the main one: nothing when there are none."""
    sets = rundata.identified_sets(run)
    if not sets:
        return Markup("")
    metric = run.effects_record.metric if run.effects_record is not None else None
    title = "1b. Key heads set by set: the operations apart (figure 15), exponentiation and GSM8K (appendices D, E)"
    rows = []
    for one in sets:
        strongest = one.strongest
        rows.append([one.name, cell(one.effects.n_samples, str(one.effects.n_samples)),
                     cell(len(one.key_heads), str(len(one.key_heads))),
                     str(strongest[0]) if strongest else "–", _effect(strongest[1] if strongest else None, metric),
                     ", ".join(map(str, one.key_heads[:8]))])
    shared = [[o.a, o.b, cell(o.k, str(o.k)), cell(len(o.shared), str(len(o.shared))),
               cell(len(o.shared) / o.k if o.k else None, pct(len(o.shared) / o.k if o.k else None)),
               ", ".join(map(str, o.shared))] for o in rundata.overlaps(sets)]
    others = [one for one in sets if one.name != rundata.MAIN_SET]
    body = [note(f"Each set's pairs (identify/NAME/pairs.jsonl) path-patched with the run's patch settings; "
                 f"{rundata.MAIN_SET} is the run's own pairs (section 1). Only the main key heads are used by the "
                 "later stages."),
            side_by_side(img(run.also_identify(one.name) / "heatmap.png", f"effect of patching each head on "
                             f"{one.name}") for one in others),
            heading("Each set's key heads"),
            table(["set", "pairs", "key heads", "strongest head", "its effect", "top key heads"], rows,
                  "key-head-sets"),
            heading("Key heads in common (figure 15; table 4 for GSM8K)"),
            note("For each two sets, how many of their top-k key heads they share (k: the smaller key-head count)."),
            table(["set", "other set", "k", "shared", "share", "shared heads"], shared, "key-head-overlap")]
    return section("identify-sets", title, join(body))


def knockout(run: RunFolder) -> Markup:
    folder = run.knockout
    ko = run.knockout_record
    title = "2. Knocking heads out: effect-rank vs random heads (figure 3)"
    if ko is None:
        return section("knockout", title, not_run("knockout", f"{RunFolder.KNOCKOUT}/{KNOCKOUT_JSON}"))
    key = ko.key_heads
    summary = (f"Mean ablation ({ko.mean} mean) on {ko.n_samples} reference prompts. Knocking out "
               f"the {len(key.heads)} key heads [{heads_text(key.heads)}]: accuracy {pct(key.accuracy_before)} → "
               f"{pct(key.accuracy_after)} ({signed_pct(key.relative_change)} relative).")
    body = [para(summary, "headline", "key-heads-knockout"),
            figures(folder, [("knockout_curves.png", "accuracy while top-k heads are knocked out")])]
    curves = ko.curves
    if curves is not None:
        order = [""] + [str(h) for h in curves.effect_order]
        rows = [
            [
                cell(k, str(k)),
                order[i] if i < len(order) else "",
                cell(curves.effect_rank[i], pct(curves.effect_rank[i])),
                cell(curves.random_mean[i], pct(curves.random_mean[i])),
                cell(curves.random_std[i], pct(curves.random_std[i])),
            ]
            for i, k in enumerate(curves.k)
        ]
        body += [heading("Accuracy by k"),
                 table(["k", "head added (effect-rank)", "effect-rank", "random-rank mean", "random-rank std"], rows,
                       "curves")]
    else:
        body.append(note("No knockout curves: the run had no effects.json to rank heads by."))
    body.append(bullet_list(ko.notes))
    return section("knockout", title, join(body))


def transfer(run: RunFolder) -> Markup:
    ko = run.knockout_record
    title = "3. Transfer to other data, with a random-heads control (figure 4)"
    if ko is None:
        return section("transfer", title, not_run("knockout", f"{RunFolder.KNOCKOUT}/{KNOCKOUT_JSON}"))
    tr = ko.transfer
    if tr is None or not tr.rows:
        return section("transfer", title, note("The transfer sets were not run (transfer was off)."))
    ctrl = tr.random_heads
    draws = max((len(r.random_draws()) for r in tr.rows), default=0)
    rows = [
        [
            r.set,
            cell(r.n, str(r.n)),
            cell(r.accuracy_before, pct(r.accuracy_before)),
            cell(r.accuracy_after, pct(r.accuracy_after)),
            cell(r.relative_change, signed_pct(r.relative_change)),
            cell(r.accuracy_random_heads, pct(r.accuracy_random_heads)),
            cell(r.relative_change_random_heads, signed_pct(r.relative_change_random_heads)),
            "; ".join(x for x in (r.note, r.fallback) if x),
        ]
        for r in tr.rows
    ]
    body = [note(f"Knocked out ({ko.mean} mean): {heads_text(tr.heads)}. Control: as many "
                 "random other heads"
                 + (f", {draws} draw{'s' * (draws > 1)} (the first: {heads_text(ctrl)}); its columns give the mean "
                    "over the draws." if ctrl else " (not run).")),
            table(["set", "n", "before", "after (key heads out)", "relative", "after (random heads out)",
                   "relative (random)", "note"], rows, "transfer")]
    if tr.cases:
        body += [heading("Cases: the top-5 next tokens before and after the knockout"), *map(_case, tr.cases)]
    return section("transfer", title, join(body))


def _case(case: Case) -> Markup:
    shown = case.prompt if len(case.prompt) <= 240 else "…" + case.prompt[-240:]

    def top(pairs: list[tuple[str, float]]) -> str:
        return ", ".join(f"{t!r} {p:.1%}" for t, p in pairs)

    rows = [[label, repr(pairs[0][0]) if pairs else "–", top(pairs)]
            for label, pairs in (("before knockout", case.before), ("after knockout", case.after))]
    return MACROS.case(case.name, case.answer, shown, table(["", "next token", "top-5 probabilities"], rows))


def attention(run: RunFolder) -> Markup:
    folder = run.attention
    att = run.attention_record
    title = "4. Where the key heads look: attention from END by token role (figure 5)"
    if att is None:
        return section("attention", title, not_run("attention", f"{RunFolder.ATTENTION}/{ATTENTION_JSON}"))
    effects = {Head(e.layer, e.head): e.effect for e in att.effects or []}
    rows = []
    for lab in att.labels:
        top = ", ".join(f"{t} {v:.2f}" for t, v in lab.top_other_tokens)
        effect = effects[lab.head] if lab.head in effects else None
        rows.append([str(lab.head), cell(lab.label, None, f"label {lab.label}"), lab.lean,
                     cell(effect, signed_pct(effect, 2)),
                     *[cell(v, num(v, ".3f"))
                       for v in (lab.operand_A_plus_B, lab.operator, lab.other_words, lab.first_token)], top])
    counts = ", ".join(f"{t}: {n}" for t, n in att.counts.items())
    body = [note(f"Mean attention of each key head from the END token over {att.n_samples} reference prompts "
                 f"({counts}), summed per token role."),
            figures(folder, [("attention_by_role.png", "attention by token role")], others=False),
            heading("Each key head's label"),
            table(["head", "label", "lean", "effect", "operands A+B", "operator", "other words", "first token",
                   "most-attended other tokens"], rows, "labels"),
            heading("Single prompts and unseen formats (figures 7 and 16)"),
            figures(folder, [("attention_cases.png", "END attention on one prompt per task"),
                             ("attention_transfer_cases.png", "END attention on unseen formats")],
                    skip=("attention_by_role.png",)),
            bullet_list(att.notes)]
    return section("attention", title, join(body))


def mlp(run: RunFolder) -> Markup:
    folder = run.mlp
    data = run.mlp_record
    title = "5. What the MLPs compute: read and write vs number tokens (figure 6)"
    if data is None:
        return section("mlp", title, not_run("mlp", f"{RunFolder.MLP}/{MLP_JSON}"))
    tp, case = data.turning_points, data.case
    tail = case.prompt.rstrip().splitlines()[-1:] or [""]
    body = [para(f"Start–inflection–end layers: {tp.start}–{tp.inflection}–{tp.end} "
                 f"(over {data.n_samples} prompts, MLP input read at {data.read_point}).", "headline"),
            note(f"Rule: {data.rule}"),
            figures(folder, [("mlp_input_operands.png", "MLP input vs operand tokens"),
                             ("mlp_output_answer.png", "MLP write vs the answer token"),
                             ("mlp_case.png", "the case, layer by layer")])]
    tops = case.top3_per_layer
    if tops:
        contrast = data.answer_contrast
        value = [contrast[l] if l < len(contrast) else None for l in range(len(tops))]
        rows = [[cell(l, str(l)), ", ".join(t), cell(value[l], num(value[l], ".3f"))]
                for l, t in enumerate(tops)]
        body += [
            heading(f"The case {tail[0].strip()} → {case.answer}"),
            table(["layer", "top numbers in the MLP write", "answer contrast (mean over prompts)"], rows, "mlp-case"),
        ]
    return section("mlp", title, join(body))


def heads_text(heads: Iterable[Head]) -> str:
    """Heads as people read them: "14.2, 21.2"."""
    return ", ".join(map(str, heads))

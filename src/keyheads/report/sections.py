"""The analysis sections, one function each, in the paper's figure order (figures 2 to 6; the sets identified
apart, figure 15 and appendices D and E, after the main identification).

Each takes the run folder and returns HTML; a stage that left nothing behind gives a one-line
"did not run" note, never an exception.
"""
from __future__ import annotations

from markupsafe import Markup

from ..components import rule_text
from ..heads import Head, heads_of
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
    if not isinstance(keys, dict):
        return section("identify", title, not_run("identify", RunFolder.KEY_HEADS))
    eff = eff if isinstance(eff, dict) else {}
    metric = keys.get("metric") or eff.get("metric")
    sem = eff.get("heads_sem") or []
    intro = (f"{eff.get('method', '?')} patching, metric {metric}, over {eff.get('n_samples', '?')} prompts "
             f"({eff.get('n_excluded', 0)} excluded). Key heads: {len(keys.get('heads', []))} of "
             f"{keys.get('n_heads_total', '?')}, chosen as {rule_text(keys.get('threshold'), keys.get('top_k'))}.")
    rows = []
    for i, k in enumerate(keys.get("heads", [])):
        l, h = k["layer"], k["head"]
        s = sem[l][h] if l < len(sem) and h < len(sem[l]) else None
        rows.append(
            [
                cell(i + 1, str(i + 1)),
                k["label"],
                cell(l, str(l)),
                cell(h, str(h)),
                _effect(k["effect"], metric),
                cell(s, num(s, ".2g")),
            ]
        )
    body = [note(intro), figures(folder, [("heatmap.png", "effect of patching each head and MLP")]),
            heading("Key heads"), table(["rank", "head", "layer", "index", "effect", "s.e.m."], rows, "key-heads")]
    mlps = eff.get("mlps") or []
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
    metric = (run.effects_record or {}).get("metric") if isinstance(run.effects_record, dict) else None
    title = "1b. Key heads set by set: the operations apart (figure 15), exponentiation and GSM8K (appendices D, E)"
    rows = []
    for one in sets:
        strongest = one.strongest
        rows.append([one.name, cell(one.effects.get("n_samples"), str(one.effects.get("n_samples", "–"))),
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
    if not isinstance(ko, dict):
        return section("knockout", title, not_run("knockout", f"{RunFolder.KNOCKOUT}/{KNOCKOUT_JSON}"))
    key = ko.get("key_heads") or {}
    heads = key.get("heads", [])
    summary = (f"Mean ablation ({ko.get('mean')} mean) on {ko.get('n_samples')} reference prompts. Knocking out "
               f"the {len(heads)} key heads [{heads_text(heads)}]: accuracy {pct(key.get('accuracy_before'))} → "
               f"{pct(key.get('accuracy_after'))} ({signed_pct(key.get('relative_change'))} relative).")
    body = [para(summary, "headline", "key-heads-knockout"),
            figures(folder, [("knockout_curves.png", "accuracy while top-k heads are knocked out")])]
    curves = ko.get("curves")
    if curves:
        order = [""] + [str(h) for h in heads_of(curves.get("effect_order", []))]
        rows = [
            [
                cell(k, str(k)),
                order[i] if i < len(order) else "",
                cell(curves["effect_rank"][i], pct(curves["effect_rank"][i])),
                cell(curves["random_mean"][i], pct(curves["random_mean"][i])),
                cell(curves["random_std"][i], pct(curves["random_std"][i])),
            ]
            for i, k in enumerate(curves["k"])
        ]
        body += [heading("Accuracy by k"),
                 table(["k", "head added (effect-rank)", "effect-rank", "random-rank mean", "random-rank std"], rows,
                       "curves")]
    else:
        body.append(note("No knockout curves: the run had no effects.json to rank heads by."))
    body.append(bullet_list(ko.get("notes") or []))
    return section("knockout", title, join(body))


def transfer(run: RunFolder) -> Markup:
    ko = run.knockout_record
    title = "3. Transfer to other data, with a random-heads control (figure 4)"
    if not isinstance(ko, dict):
        return section("transfer", title, not_run("knockout", f"{RunFolder.KNOCKOUT}/{KNOCKOUT_JSON}"))
    tr = ko.get("transfer")
    if not tr or not tr.get("rows"):
        return section("transfer", title, note("The transfer sets were not run (transfer was off)."))
    ctrl = tr.get("random_heads")
    rows = [
        [
            r["set"],
            cell(r["n"], str(r["n"])),
            cell(r["accuracy_before"], pct(r["accuracy_before"])),
            cell(r["accuracy_after"], pct(r["accuracy_after"])),
            cell(r["relative_change"], signed_pct(r["relative_change"])),
            cell(r.get("accuracy_random_heads"), pct(r.get("accuracy_random_heads"))),
            cell(r.get("relative_change_random_heads"), signed_pct(r.get("relative_change_random_heads"))),
            "; ".join(x for x in (r.get("note"), r.get("fallback")) if x),
        ]
        for r in tr["rows"]
    ]
    body = [note(f"Knocked out ({ko.get('mean')} mean): {heads_text(tr.get('heads', []))}. Control: as many "
                 "random other heads"
                 + (f" ({heads_text(ctrl)})." if ctrl else " (not run).")),
            table(["set", "n", "before", "after (key heads out)", "relative", "after (random heads out)",
                   "relative (random)", "note"], rows, "transfer")]
    cases = tr.get("cases") or []
    if cases:
        body += [heading("Cases: the top-5 next tokens before and after the knockout"), *map(_case, cases)]
    return section("transfer", title, join(body))


def _case(case: dict) -> Markup:
    prompt = case.get("prompt", "")
    shown = prompt if len(prompt) <= 240 else "…" + prompt[-240:]

    def top(pairs) -> str:
        return ", ".join(f"{t!r} {p:.1%}" for t, p in pairs or [])

    rows = [[label, repr(pairs[0][0]) if pairs else "–", top(pairs)]
            for label, pairs in (("before knockout", case.get("before")), ("after knockout", case.get("after")))]
    return MACROS.case(case.get("name", ""), case.get("answer", ""), shown,
                       table(["", "next token", "top-5 probabilities"], rows))


def attention(run: RunFolder) -> Markup:
    folder = run.attention
    att = run.attention_record
    title = "4. Where the key heads look: attention from END by token role (figure 5)"
    if not isinstance(att, dict):
        return section("attention", title, not_run("attention", f"{RunFolder.ATTENTION}/{ATTENTION_JSON}"))
    effects = {Head.from_json(e): e["effect"] for e in att.get("effects") or []}
    rows = []
    for lab in att.get("labels", []):
        top = ", ".join(f"{t} {v:.2f}" for t, v in lab.get("top_other_tokens") or [])
        head = Head.from_json(lab["head"])
        rows.append([str(head), cell(lab["label"], None, f"label {lab['label']}"), lab.get("lean", ""),
                     cell(effects.get(head), signed_pct(effects.get(head), 2)),
                     *[cell(lab.get(k), num(lab.get(k), ".3f"))
                       for k in ("operand_A_plus_B", "operator", "other_words", "first_token")], top])
    counts = ", ".join(f"{t}: {n}" for t, n in (att.get("counts") or {}).items())
    body = [note(f"Mean attention of each key head from the END token over {att.get('n_samples')} reference prompts "
                 f"({counts}), summed per token role."),
            figures(folder, [("attention_by_role.png", "attention by token role")], others=False),
            heading("Each key head's label"),
            table(["head", "label", "lean", "effect", "operands A+B", "operator", "other words", "first token",
                   "most-attended other tokens"], rows, "labels"),
            heading("Single prompts and unseen formats (figures 7 and 16)"),
            figures(folder, [("attention_cases.png", "END attention on one prompt per task"),
                             ("attention_transfer_cases.png", "END attention on unseen formats")],
                    skip=("attention_by_role.png",)),
            bullet_list(att.get("notes") or [])]
    return section("attention", title, join(body))


def mlp(run: RunFolder) -> Markup:
    folder = run.mlp
    data = run.mlp_record
    title = "5. What the MLPs compute: read and write vs number tokens (figure 6)"
    if not isinstance(data, dict):
        return section("mlp", title, not_run("mlp", f"{RunFolder.MLP}/{MLP_JSON}"))
    tp = data.get("turning_points") or {}
    case = data.get("case") or {}
    tail = (case.get("prompt") or "").rstrip().splitlines()[-1:] or [""]
    body = [para(f'Start–inflection–end layers: {tp.get("start")}–{tp.get("inflection")}–{tp.get("end")} '
                 f'(over {data.get("n_samples")} prompts, MLP input read at {data.get("read_point")}).', "headline"),
            note(f"Rule: {data.get('rule', '')}"),
            figures(folder, [("mlp_input_operands.png", "MLP input vs operand tokens"),
                             ("mlp_output_answer.png", "MLP write vs the answer token"),
                             ("mlp_case.png", "the case, layer by layer")])]
    tops = case.get("top3_per_layer") or []
    if tops:
        contrast = data.get("answer_contrast") or []
        value = [contrast[l] if l < len(contrast) else None for l in range(len(tops))]
        rows = [[cell(l, str(l)), ", ".join(t), cell(value[l], num(value[l], ".3f"))]
                for l, t in enumerate(tops)]
        body += [
            heading(f"The case {tail[0].strip()} → {case.get('answer')}"),
            table(["layer", "top numbers in the MLP write", "answer contrast (mean over prompts)"], rows, "mlp-case"),
        ]
    return section("mlp", title, join(body))


def heads_text(items) -> str:
    """Stored heads ({"layer", "head"}) as people read them: "14.2, 21.2"."""
    return ", ".join(map(str, heads_of(items)))

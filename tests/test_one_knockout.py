"""One knockout: the run's knockout row of the eval table is the knockout curves' mean ablation.

The eval stage's knockout Variant, evaluated by the evaluator's own passes on the pairs' clean prompts,
predicts the first answer token exactly as the knockout curve does with the same heads knocked out; the
global mean, which stays available under its own name, does not, and says so in its label, its info,
the results file and the report.
"""
import json

import pytest
import torch

from keyheads import pipeline
from keyheads.analysis.common import all_heads, load_samples
from keyheads.analysis.knockout_curves import CurveSettings, knockout_curves
from keyheads.analysis.passes import EndPasses
from keyheads.components import Components
from keyheads.config.run import RunSettings
from keyheads.data.benchmarks import Record
from keyheads.evaluation import EvalSettings, Variant, evaluate
from keyheads.evaluation.cache import ResultCache, item_key
from keyheads.evaluation.engine import PrefixKV, eos_ids, generate_stream, next_token_logits
from keyheads.evaluation.runner import run_task
from keyheads.evaluation.task_types import Item, Task
from keyheads.evaluation.variants import prepare
from keyheads.heads import Head
from keyheads.knockout import Knockout, away_from_end, compute_means
from keyheads.models.prompt_set import PromptSet
from keyheads.report.html import render
from keyheads.runfolder import RunFolder
from keyheads.testing import tiny_model

from tests.helpers import make_rows, write_rows

HEADS = [Head(0, 1), Head(1, 0), Head(1, 3), Head(2, 2)]


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


class FirstToken(Task):
    """The pairs' clean prompts as an eval task: the first token the model answers, and its END logits."""

    def __init__(self, prompts, answer_ids):
        self.name, self.split, self.exemplars = "first-token", "pairs", []
        self.items = [Item(Record(str(i), p, "pairs", answer=float(a)), p)
                      for i, (p, a) in enumerate(zip(prompts, answer_ids))]

    def group(self, item):
        return ""

    def settings(self, tokenizer, cfg):
        return {"type": "first-token"}

    def run(self, model, items, prefix, cfg, batch_size):
        rows = [model.tokenizer(it.prompt)["input_ids"] for it in items]  # as the eval tasks tokenise
        logits = next_token_logits(model, rows, prefix)
        return enumerate({"pred": int(row.argmax()), "logits": row.tolist()} for row in logits)

    def score(self, item, row):
        return {**row, "correct": row["pred"] == int(item.record.answer)}


def eval_stage_variants(cfg, run, model, monkeypatch):
    """What the eval stage hands the evaluator: its variants, settings and loader."""
    seen = {}
    monkeypatch.setattr(pipeline, "key_heads", lambda folder: Components(tuple(HEADS)))
    monkeypatch.setattr(pipeline, "evaluate", lambda variants, settings, out, loader, **work: seen.update(
        variants=variants, settings=settings, loader=loader))
    pipeline._eval(cfg, RunFolder(run), model, progress=False)
    return seen


@pytest.fixture
def run(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    write_rows(folder / "pairs.jsonl", make_rows(16))
    return folder


def run_config(run, mean="aligned"):
    """The run's one knockout mean is its knockout section's: the curves' and the eval row's alike."""
    return RunSettings.make(model="tiny", out=str(run), knockout=dict(mean=mean),
                            eval=dict(benchmarks=["arith-add"], limit=2))


def curve_and_eval(llama, run, cfg, stage, tmp_path):
    """The knockout curve at HEADS, and the eval stage's knockout row on the same prompts through the runner;
    the answers are the clean model's own first tokens."""
    pairs = run / "pairs.jsonl"
    samples = load_samples(llama, pairs)
    prompts = [s.prompt for s in samples]
    # the clean model's own answers, so that the knockout has right answers to break
    clean = EndPasses(llama, PromptSet(llama, prompts, 8), None).predict([[]], [0] * len(prompts))[0].top1.tolist()

    # the run's knockout stage: means of every head over the counterfactual prompts, in its mean
    cf = [s.counterfactual for s in samples]
    full = compute_means(llama, cf, heads=all_heads(llama), mean=cfg.knockout.mean, progress=False)
    ranked = HEADS + [h for h in all_heads(llama) if h not in HEADS]
    ps = PromptSet(llama, prompts, 8)
    curves = knockout_curves(llama, ps, clean, full, ranked, all_heads(llama),
                             CurveSettings(k=len(HEADS), seeds=1), progress=False)
    curve_preds = EndPasses(llama, ps, full).predict([HEADS], clean)[0].top1.tolist()
    curve_logits = {}
    EndPasses(llama, ps, full).logits([HEADS], lambda i, index, logits: curve_logits.update(zip(index, logits)))

    prepared = prepare(next(v for v in stage["variants"] if v.kind == "knockout"), stage["loader"])
    task = FirstToken(prompts, clean)
    rows, _ = run_task(prepared, task, stage["settings"], ResultCache(tmp_path / "first-token.sqlite"), progress=False)
    return clean, curves.effect[len(HEADS)], curve_preds, curve_logits, rows, prepared


def test_the_eval_stage_knockout_row_answers_as_the_knockout_curve(llama, run, tmp_path, monkeypatch):
    cfg = run_config(run)
    stage = eval_stage_variants(cfg, run, llama, monkeypatch)
    clean, curve_acc, curve_preds, curve_logits, rows, prepared = curve_and_eval(llama, run, cfg, stage, tmp_path)
    assert prepared.info["knockout"]["mean"] == "aligned"
    assert curve_preds != clean and curve_acc < 1.0, "the heads must change some answers for the test to bite"
    assert [r["pred"] for r in rows] == curve_preds  # prompt by prompt, the same first token
    assert sum(r["correct"] for r in rows) / len(rows) == pytest.approx(curve_acc, abs=0)
    for i, r in enumerate(rows):
        torch.testing.assert_close(torch.tensor(r["logits"]), curve_logits[i].float(), atol=1e-4, rtol=1e-4)


def test_the_global_mean_is_another_knockout_and_says_so(llama, run, tmp_path, monkeypatch):
    """A run with the global mean knocks out with it everywhere: its eval row answers as its own (global) curve,
    and differs from the aligned knockout."""
    cfg = run_config(run, mean="global")
    stage = eval_stage_variants(cfg, run, llama, monkeypatch)
    ko = next(v for v in stage["variants"] if v.kind == "knockout")
    assert ko.label.endswith("key heads knocked out (global mean)") and ko.opt("mean") == "global"
    clean, curve_acc, curve_preds, curve_logits, rows, prepared = curve_and_eval(llama, run, cfg, stage, tmp_path)
    assert prepared.info["knockout"]["mean"] == "global"
    assert [r["pred"] for r in rows] == curve_preds
    for i, r in enumerate(rows):
        torch.testing.assert_close(torch.tensor(r["logits"]), curve_logits[i].float(), atol=1e-4, rtol=1e-4)
    aligned = run_config(run)
    aligned_stage = eval_stage_variants(aligned, run, llama, monkeypatch)
    *_, aligned_logits, _, _ = curve_and_eval(llama, run, aligned, aligned_stage, tmp_path / "aligned")
    assert any(not torch.allclose(torch.tensor(r["logits"]), aligned_logits[i].float(), atol=1e-4)
               for i, r in enumerate(rows))


def test_the_two_means_never_share_a_cache_entry(llama, run):
    pairs = str(run / "pairs.jsonl")
    heads = [h.to_json() for h in HEADS]
    aligned, glob = (prepare(Variant.make("knockout", "tiny", heads=heads, data=pairs, mean=m), lambda _: llama)
                     for m in ("aligned", "global"))
    assert aligned.fingerprint != glob.fingerprint
    assert item_key(aligned.fingerprint, "gsm8k", "q", {}) != item_key(glob.fingerprint, "gsm8k", "q", {})
    # a row that names no mean takes the settings' one, aligned unless told
    assert prepare(Variant.make("knockout", "tiny", heads=heads, data=pairs), lambda _: llama).fingerprint \
        == aligned.fingerprint
    assert glob.label == "tiny [knockout, global mean]" and aligned.label == "tiny [knockout]"
    assert aligned.end_window == max(len(llama.encode([r["counterfactual"]]).input_ids[0]) for r in make_rows(16))
    assert glob.end_window == 0


FEW_SHOT = "9 + 9 = 18\n8 + 8 = 16\n7 + 7 = 14\n6 + 6 = 12\n"  # longer than any counterfactual prompt


def test_a_shared_prefix_and_generation_keep_the_aligned_means(llama, run):
    """Few-shot prompts longer than the counterfactual ones share a prefix in the evaluator; every row gets
    the means it gets when run on its own (aligned from END, the mean over all positions before), and a
    generated token gets the mean over all positions."""
    pairs = str(run / "pairs.jsonl")
    prepared = prepare(Variant.make("knockout", "tiny", heads=[h.to_json() for h in HEADS], data=pairs),
                       lambda _: llama)
    prompts = [FEW_SHOT + r["reference"] for r in make_rows(8)]
    rows = [llama.tokenizer(p)["input_ids"] for p in prompts]
    with llama.hooks(edit=prepared.edits):
        prefix = PrefixKV(llama, keep=prepared.end_window)
        shared = next_token_logits(llama, rows, prefix)
        assert prefix.computed == 1  # the few-shot block was shared
        alone = torch.cat([next_token_logits(llama, [r]) for r in rows])
        torch.testing.assert_close(shared, alone, atol=1e-4, rtol=1e-4)
        # a prefix that ran into the aligned part would give those positions the mean over all positions
        cut = next_token_logits(llama, rows, PrefixKV(llama, keep=1))
        assert not torch.allclose(cut, alone, atol=1e-4)

        generated = dict(generate_stream(llama, rows, 3, None, PrefixKV(llama, keep=prepared.end_window)))
    # the same three tokens, one forward pass per step over the whole row: the prompt aligned from END, and
    # each generated token with the mean over all positions (`away_from_end` for the new position only)
    ko = compute_means(llama, [r["counterfactual"] for r in make_rows(16)], heads=HEADS, progress=False)
    for i, row in enumerate(rows):
        ids = list(row)
        for _ in range(3):
            token = _next_with_generated_global(llama, ko, ids, len(row))
            if token in eos_ids(llama):
                break
            ids.append(token)
        assert generated[i][0] == llama.tokenizer.decode(ids[len(row):], skip_special_tokens=True)


def _next_with_generated_global(model, ko: Knockout, ids, prompt_len):
    """The next token of `ids` when the prompt's positions get their END-aligned means and later ones the global."""
    def head_edit(layer, index):
        def edit(z):
            z = z.clone()
            prompt = ko._values(ko.head_means[layer], ko.head_global[layer], prompt_len)
            with away_from_end():
                after = ko._values(ko.head_means[layer], ko.head_global[layer], z.shape[1] - prompt_len)
            means = torch.cat([prompt, after]).to(z)
            z[:, :, index] = means[:, index].unsqueeze(0)
            return z
        return edit

    layers = sorted({l for l, _ in HEADS})
    edits = {f"{l}.head_out": head_edit(l, torch.tensor(sorted(h for m, h in HEADS if m == l))) for l in layers}
    with torch.no_grad(), model.hooks(edit=edits):
        return int(model.hf(input_ids=torch.tensor([ids])).logits[0, -1].argmax())


def test_the_eval_command_and_its_files_name_the_global_mean(tmp_path, run, llama, monkeypatch):
    settings = EvalSettings(benchmarks=("arith-add",), limit=2, few_shot=1, max_new_tokens=2)
    pairs = str(run / "pairs.jsonl")
    rows = [Variant.make("model", "tiny", label="tiny"),
            Variant.make("knockout", "tiny", label="tiny - 4 key heads knocked out (global mean)",
                         heads=[h.to_json() for h in HEADS], data=pairs)]  # no mean: the caller's
    evaluate(rows, settings, run / "eval", loader=lambda _: llama, mean="global", cache_dir=tmp_path / "cache",
             progress=False)
    results = json.loads((run / "eval" / "results.json").read_text())
    ko = results["variants"][1]
    assert ko["info"]["knockout"]["mean"] == "global" and ko["info"]["variant"]["options"]["mean"] == "global"
    assert "tiny - 4 key heads knocked out (global mean)" in (run / "eval" / "table.md").read_text()
    page = render(run)
    assert "knockout (global mean)" in page  # the report's table 1 says which mean the row used

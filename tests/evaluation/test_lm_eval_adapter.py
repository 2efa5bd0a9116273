"""The lm-eval adapter (runs only where lm-evaluation-harness is installed)."""
import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from keyheads.testing import tiny_model  # noqa: E402

from tests.helpers import make_rows, write_rows  # noqa: E402


def test_loglikelihood_matches_direct_and_knockout_changes_it(tmp_path, monkeypatch):
    import keyheads.evaluation.lm_eval_adapter as adapter

    tiny = tiny_model("llama")
    monkeypatch.setattr("keyheads.models.loading.load_model", lambda *a, **k: tiny)
    reqs = [Instance(request_type="loglikelihood", doc={}, arguments=("1 + 2 =", " 3"), idx=0)]
    base = adapter.KeyheadsLM(model="tiny", batch_size=1)
    (got, _), = base.loglikelihood(reqs)
    base.close()
    ids = tiny.tokenizer("1 + 2 = 3", return_tensors="pt").input_ids[0]  # a character tokenizer:
    with torch.no_grad():                                                   # " 3" is the last two tokens
        logits = tiny.hf(ids[None]).logits.log_softmax(-1)[0]
    logp = sum(logits[i - 1, ids[i]].item() for i in (len(ids) - 2, len(ids) - 1))
    assert got == pytest.approx(logp, abs=1e-4)

    pairs = write_rows(tmp_path / "pairs.jsonl", make_rows(8))
    ko = adapter.KeyheadsLM(model="tiny", knockout="0.1;2.2", knockout_data=str(pairs), batch_size=1)
    (knocked, _), = ko.loglikelihood(reqs)
    ko.close()
    assert abs(knocked - got) > 1e-4
    (after_close, _), = base.loglikelihood(reqs)  # closing a knockout removes its hooks from the shared model
    assert after_close == pytest.approx(got, abs=1e-5)


def test_mmlu_letter_scores_agree_with_lm_eval_for_base_knockout_and_precise_adapter(tmp_path, monkeypatch):
    """On the same MMLU prompts, lm-eval's log-likelihood of each answer letter through the adapter and
    keyheads' own letter scores (logits) rank and space the letters alike: their differences from letter A
    agree within 1e-4, for the base model, a knockout and a precise-SFT run folder (adapter=DIR)."""
    import keyheads.evaluation.lm_eval_adapter as adapter
    from keyheads.components import Components
    from keyheads.evaluation.settings import EvalSettings
    from keyheads.evaluation.tasks import ChoiceTask
    from keyheads.evaluation.variants import prepare
    from keyheads.finetune import FinetuneSettings, finetune
    from keyheads.finetune.data import Example

    from tests.helpers import write_tiny_benchmarks

    # a fresh copy each call
    monkeypatch.setattr("keyheads.models.loading.load_model", lambda *a, **k: tiny_model("llama"))
    data = tmp_path / "benchmarks"
    data.mkdir()
    write_tiny_benchmarks(data)
    pairs = write_rows(tmp_path / "pairs.jsonl", make_rows(8))
    examples = [Example(f"{a} + {b} = ", str(a + b)) for a in range(4) for b in range(3)]
    finetune(tiny_model("llama"), examples, FinetuneSettings(max_steps=2, optimizer_batch_size=4, micro_batch_size=2,
                                                             lr=5e-2),
             tmp_path / "ft", Components(((1, 0), (2, 1)), ()), progress=False)
    cfg = EvalSettings(benchmarks=("mmlu",))
    task = ChoiceTask("mmlu", cfg, str(data))
    assert len(task.items) >= 3
    rows_by = {}
    for name, args in {"base": {}, "knockout": {"knockout": "0.1;2.2", "knockout_data": str(pairs)},
                       "precise": {"adapter": str(tmp_path / "ft")}}.items():
        prepared = prepare(adapter.variant_from_args("tiny", **args), lambda _: tiny_model("llama"))
        with prepared.model.hooks(edit=prepared.edits):
            ours = [row for _, row in sorted(task.run(prepared.model, task.items, None, cfg, 16))]
        lm = adapter.KeyheadsLM(model="tiny", batch_size=1, **args)
        letters = "ABCDEFGH"
        for item, row in zip(task.items, ours):
            reqs = [Instance(request_type="loglikelihood", doc={}, arguments=(item.prompt, f" {letters[i]}"), idx=i)
                    for i in range(len(row["scores"]))]
            theirs = [ll for ll, _ in lm.loglikelihood(reqs)]
            for i in range(1, len(theirs)):
                assert theirs[i] - theirs[0] == pytest.approx(row["scores"][i] - row["scores"][0], abs=1e-4), \
                    (name, item.record.id, i)
        lm.close()
        rows_by[name] = [r["scores"] for r in ours]
    # the three variants are three different models: the comparison above is not of one model thrice
    assert rows_by["base"] != rows_by["knockout"] and rows_by["base"] != rows_by["precise"]

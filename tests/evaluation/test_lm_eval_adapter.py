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
    monkeypatch.setattr("keyheads.models.load_model", lambda *a, **k: tiny)
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

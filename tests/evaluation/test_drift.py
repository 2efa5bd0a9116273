"""generic-kl: KL from the reference row and perplexity on MMLU/CSQA texts, against a direct computation."""
import contextlib
import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from keyheads.evaluation import Variant
from keyheads.evaluation.cache import ResultCache
from keyheads.evaluation.drift import DriftTask, bootstrap, drift_items
from keyheads.evaluation.runner import run_task
from keyheads.evaluation.task_types import PairwiseTask
from keyheads.evaluation.variants import prepare
from keyheads.knockout import away_from_end
from keyheads.models.model import HookedModel

from tests.helpers import evaluation, prepared, run_evaluation


def cfg(data, tmp_path, **kw):
    return evaluation(data, tmp_path / "cache", benchmarks=("generic-kl",), limit=6, batch_size=4, progress=False,
                      **kw)


def perturbed(model, scale=0.05):
    """A copy of the model with one MLP's weights changed: a stand-in for a fine-tuned variant."""
    hf = copy.deepcopy(model.hf)
    torch.manual_seed(0)
    with torch.no_grad():
        w = hf.model.layers[1].mlp.down_proj.weight
        w.add_(scale * torch.randn_like(w))
    return HookedModel(hf, model.tokenizer, name=model.name + "-tuned", source=model.source)


def direct(ref_model, var_model, texts, var_edits=None, no_end=False):
    """Mean KL(ref || var) per position and the variant's perplexity, one text at a time, by F.kl_div/cross_entropy
    (no_end: a knockout's heads get the mean over all positions, a text having no END)."""
    kl = nll = positions = tokens = 0.0
    for text in texts:
        ids = torch.tensor([ref_model.tokenizer(text)["input_ids"]])
        with torch.no_grad():
            ref = ref_model.hf(input_ids=ids).logits[0].double().log_softmax(-1)
            with var_model.hooks(edit=var_edits or {}), away_from_end() if no_end else contextlib.nullcontext():
                var = var_model.hf(input_ids=ids).logits[0].double().log_softmax(-1)
        kl += F.kl_div(var, ref, log_target=True, reduction="sum").item()
        nll += F.cross_entropy(var[:-1], ids[0, 1:], reduction="sum").item()
        positions += ids.shape[1]
        tokens += ids.shape[1] - 1
    return kl / positions, math.exp(nll / tokens)


def test_kl_and_perplexity_match_a_direct_computation(tiny, tiny_data, tmp_path):
    tuned = perturbed(tiny)
    rows = run_evaluation([prepared(tiny, label="base"), prepared(tuned, label="tuned")],
                    cfg(tiny_data, tmp_path), tmp_path / "run")
    texts = [it.prompt for it in drift_items(cfg(tiny_data, tmp_path).settings, str(tiny_data))]
    assert len(texts) >= 4 and len(set(texts)) == len(texts)
    base, var = rows[0]["benchmarks"]["generic-kl"], rows[1]["benchmarks"]["generic-kl"]
    kl, ppl = direct(tiny, tuned, texts)
    assert var["kl"] == pytest.approx(kl, rel=1e-4) and kl > 1e-4
    assert var["perplexity"] == pytest.approx(ppl, rel=1e-5)
    assert base["kl"] == 0.0  # the reference row against itself
    assert base["perplexity"] == pytest.approx(direct(tiny, tiny, texts)[1], rel=1e-5)
    assert var["kl_ci95"][0] <= var["kl"] <= var["kl_ci95"][1]
    table = (tmp_path / "run" / "table.md").read_text()
    assert "Generic KL" in table and f"{var['kl']:.4f}" in table


@pytest.mark.parametrize("mean", ["aligned", "global"])
def test_knockout_row_drifts_with_its_edits_and_the_reference_without(tiny, tiny_data, tmp_path, pairs_file, mean):
    """A text scored at every position has no END: either mean gives the heads the mean over all positions."""
    ko = prepare(Variant.make("knockout", "tiny", label="ko", heads=[[1, 0], [2, 1]], data=str(pairs_file),
                              mean=mean), lambda name: tiny)
    rows = run_evaluation([prepared(tiny, label="base"), ko], cfg(tiny_data, tmp_path), tmp_path / "run")
    texts = [it.prompt for it in drift_items(cfg(tiny_data, tmp_path).settings, str(tiny_data))]
    kl, ppl = direct(tiny, tiny, texts, var_edits=ko.edits, no_end=True)
    got = rows[1]["benchmarks"]["generic-kl"]
    assert got["kl"] == pytest.approx(kl, rel=1e-4) and kl > 0
    assert got["perplexity"] == pytest.approx(ppl, rel=1e-5)


def test_rerun_is_served_from_the_cache(tiny, tiny_data, tmp_path, monkeypatch):
    variants = [prepared(tiny, label="base"), prepared(perturbed(tiny), label="tuned")]
    first = run_evaluation(variants, cfg(tiny_data, tmp_path), tmp_path / "a")

    def fail(*a, **k):
        raise AssertionError("computed again")

    monkeypatch.setattr("keyheads.evaluation.drift.log_probs", fail)
    second = run_evaluation(variants, cfg(tiny_data, tmp_path), tmp_path / "b")
    for a, b in zip(first, second):
        assert a["benchmarks"]["generic-kl"]["kl"] == b["benchmarks"]["generic-kl"]["kl"]
        assert b["benchmarks"]["generic-kl"]["timing"]["computed"] == 0


def test_bootstrap_interval_covers_the_ratio_and_shrinks_with_more_items():
    few = [(1.0 + (i % 3), 10.0) for i in range(10)]
    many = few * 20
    lo, hi = bootstrap(few, lambda a, b: a / b)
    lo2, hi2 = bootstrap(many, lambda a, b: a / b)
    assert lo <= 0.19 <= hi and (hi2 - lo2) < (hi - lo)
    assert bootstrap(few, lambda a, b: a / b) == [lo, hi]  # seeded: the same interval every time


def test_bootstrap_is_the_percentile_interval_of_seeded_item_resamples():
    """Against a direct computation: n rows of item indices drawn from default_rng(seed), the ratio of
    the resampled sums, and the 2.5th and 97.5th percentiles (linear between order statistics)."""
    rng = np.random.default_rng(7)
    values = np.stack([rng.random(23), rng.integers(5, 20, 23).astype(float)], axis=1)
    picks = np.random.default_rng(3).integers(0, len(values), size=(500, len(values)))
    sums = values[picks].sum(axis=1)
    direct = np.percentile(np.exp(sums[:, 0] / sums[:, 1]), [2.5, 97.5])
    got = bootstrap([tuple(v) for v in values], lambda a, b: np.exp(a / b), n=500, seed=3)
    assert got == pytest.approx(direct, rel=1e-12)
    assert all(math.isnan(x) for x in bootstrap([(1.0, 2.0)], lambda a, b: a / b))  # one item: no interval


class Recording(PairwiseTask):
    """A pairwise task that records how the runner calls it."""

    def __init__(self, items):
        self.name, self.split, self.exemplars, self.items, self.calls = "recording", "test", [], items, []

    def group(self, item):
        return ""

    def settings(self, tokenizer, cfg):
        return {"reference": self.reference.fingerprint}

    def run_pair(self, prepared, items, cfg):
        self.calls.append((prepared.label, self.reference.label, len(items)))
        return [{"id": it.record.id} for it in items]

    def score(self, item, row):
        return {**row, "correct": True}


def test_the_runner_dispatches_on_the_pairwise_type(tiny, tiny_data, tmp_path):
    assert issubclass(DriftTask, PairwiseTask)
    items = drift_items(cfg(tiny_data, tmp_path).settings, str(tiny_data))[:3]
    task = Recording(items)
    base, tuned = prepared(tiny, label="base"), prepared(perturbed(tiny), label="tuned")
    rows, timing = run_task(tuned, task, cfg(tiny_data, tmp_path).settings, ResultCache(tmp_path / "c.sqlite"), base,
                            progress=False)
    assert task.calls == [("tuned", "base", 3)] and len(rows) == 3 and timing["computed"] == 3
    with pytest.raises(TypeError, match="run_pair"):
        task.run(tiny, items, None, cfg(tiny_data, tmp_path).settings, 4)
    # without a reference, a variant is compared with itself
    alone = Recording(items)
    run_task(base, alone, cfg(tiny_data, tmp_path).settings, ResultCache(tmp_path / "d.sqlite"), progress=False)
    assert alone.calls == [("base", "base", 3)]


def test_item_sums_over_position_blocks_equal_one_whole_computation():
    """Texts longer than drift.ROWS positions are summed block by block; the sums are those of one pass."""
    from keyheads.evaluation.drift import ROWS, item_sums

    g = torch.Generator().manual_seed(0)
    T, V = 2 * ROWS + 17, 50
    ref = torch.log_softmax(torch.randn(T, V, generator=g), -1)
    var = torch.log_softmax(torch.randn(T, V, generator=g), -1)
    ids = torch.randint(0, V, (T,), generator=g).tolist()
    r, v = ref.double(), var.double()
    kl = float((r.exp() * (r - v)).sum())
    nll = float(-sum(v[t, ids[t + 1]] for t in range(T - 1)))
    got = item_sums(ref, var, ids)
    assert got["kl_sum"] == pytest.approx(kl, rel=1e-12) and got["nll_sum"] == pytest.approx(nll, rel=1e-12)
    assert (got["positions"], got["tokens"]) == (T, T - 1)

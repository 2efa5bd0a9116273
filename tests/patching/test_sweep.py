"""Patching runs: outputs, key heads, checkpoint/resume and bad input."""
import json

import numpy as np
import pytest

from keyheads.effects import Effects
from keyheads.patching import BadSample, IdentifySettings, draw_heatmap, run_sweep
from keyheads.patching import sweep as sweep_module
from keyheads.results.identify import KeyHeads
from keyheads.testing import tiny_model

pytestmark = pytest.mark.slow  # patching runs with resume, about 10 s in all

PAIRS = [("3 + 4 = ", "3 @ 4 = ", "7"), ("5 + 2 = ", "5 < 2 = ", "7"), ("1 + 1 = ", "1 > 1 = ", "2"),
         ("2 + 6 = ", "2 # 6 = ", "8"), ("Q: 4 + 4? A: ", "Q: 4 @ 4? A: ", "8")]


def write_pairs(path, pairs=PAIRS, extra=None):
    rows = [{"reference": r, "counterfactual": c, "answer": a, **(extra or {})} for r, c, a in pairs]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def test_effects_are_the_mean_of_per_sample_scores(model, tmp_path):
    data = write_pairs(tmp_path / "pairs.jsonl")
    effects, state = run_sweep(model, data, IdentifySettings(min_abs_logit=0.0), out=tmp_path, batch_size=2,
                               progress=False)
    o = state["original"]
    direct = ((state["heads"] - o[:, None, None]) / o[:, None, None]).mean(0)
    np.testing.assert_allclose(np.asarray(effects.heads), direct, rtol=1e-5, atol=1e-7)
    assert effects.n_samples == len(PAIRS) and effects.n_excluded == 0
    assert state["done"].all()


def test_relative_metric_excludes_near_zero_logits(model, tmp_path):
    data = write_pairs(tmp_path / "pairs.jsonl")
    _, state = run_sweep(model, data, IdentifySettings(min_abs_logit=0.0), progress=False)
    cut = float(np.median(np.abs(state["original"])))
    effects, _ = run_sweep(model, data, IdentifySettings(min_abs_logit=cut), progress=False)
    assert effects.n_excluded == int((np.abs(state["original"]) < cut).sum()) > 0
    assert effects.n_samples + effects.n_excluded == len(PAIRS)


def test_outputs_and_key_heads(model, tmp_path):
    data = write_pairs(tmp_path / "pairs.jsonl")
    effects, _ = run_sweep(model, data, IdentifySettings(metric="logit-diff"), progress=False)
    effects.write(tmp_path / "effects.json")
    saved = json.loads((tmp_path / "effects.json").read_text())
    for key in ("metric", "method", "model", "n_samples", "n_excluded", "data_sha256", "heads", "mlps"):
        assert key in saved
    assert np.asarray(saved["heads"]).shape == (model.n_layers, model.n_heads)
    rows = (tmp_path / "effects.csv").read_text().splitlines()
    assert len(rows) == 1 + model.n_layers * model.n_heads + model.n_layers
    flat = sorted((v, l, h) for l, r in enumerate(effects.heads) for h, v in enumerate(r))
    top3 = KeyHeads.chosen(effects, threshold=None, top_k=3)
    assert top3.heads_ranked == [(l, h) for _, l, h in flat[:3]]
    cut = flat[4][0]
    below = KeyHeads.chosen(effects, threshold=cut)
    assert len(below.heads) == 4 and all(k.effect < cut for k in below.heads)
    png = draw_heatmap(effects, tmp_path / "heatmap.png", key=[(1, 2)])
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert Effects.load(tmp_path / "effects.json").heads == effects.heads


def test_interrupted_sweep_resumes(model, tmp_path, monkeypatch):
    data = write_pairs(tmp_path / "pairs.jsonl")
    config = IdentifySettings()
    full, _ = run_sweep(model, data, config, batch_size=1, progress=False)
    calls = {"n": 0}
    real = sweep_module.PATCH_METHODS["path"]

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    out = tmp_path / "run"
    monkeypatch.setitem(sweep_module.PATCH_METHODS, "path", flaky)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(model, data, config, out=out, batch_size=1, progress=False)
    with np.load(out / "per_sample.npz") as saved:
        assert saved["done"].sum() == 2
    calls["n"] = -100
    counted = {"n": 0}

    def counting(*args, **kwargs):
        counted["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setitem(sweep_module.PATCH_METHODS, "path", counting)
    resumed, _ = run_sweep(model, data, config, out=out, batch_size=1, progress=False)
    assert counted["n"] == len(PAIRS) - 2  # only the unfinished samples ran
    np.testing.assert_allclose(resumed.heads, full.heads, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="different settings.*metric"):
        run_sweep(model, data, IdentifySettings(metric="prob"), out=out, batch_size=1, progress=False)


def test_bad_input_is_explained(model, tmp_path):
    bad_len = write_pairs(tmp_path / "len.jsonl", PAIRS[:1] + [("3 + 4 = ", "3 nothing 4 = ", "7")])
    with pytest.raises(BadSample, match=r"len.jsonl:2: reference has 8 tokens but counterfactual has 14"):
        run_sweep(model, bad_len, IdentifySettings(), progress=False)
    multi = write_pairs(tmp_path / "multi.jsonl", [("9 + 9 = ", "9 @ 9 = ", "18")])
    with pytest.raises(BadSample, match=r"multi.jsonl:1: the answer '18' is 2 tokens"):
        run_sweep(model, multi, IdentifySettings(), progress=False)
    effects, _ = run_sweep(model, multi, IdentifySettings(first_token=True, min_abs_logit=0), progress=False)
    assert effects.n_samples == 1
    with pytest.raises(ValueError, match="valid methods are path, activation, attribution"):
        run_sweep(model, multi, IdentifySettings(method="magic"), progress=False)
    with pytest.raises(ValueError, match="valid metrics are relative-logit, logit-diff, prob"):
        run_sweep(model, multi, IdentifySettings(metric="magic"), progress=False)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"reference": "1", "counterfactual": "2", "answer": "3"}\n{oops\n')
    with pytest.raises(ValueError, match="broken.jsonl:2"):
        run_sweep(model, broken, IdentifySettings(), progress=False)


def test_cli_writes_the_run_folder(model, tmp_path):
    from keyheads.cli import main

    folder = tmp_path / "tiny"
    model.hf.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    # a saved folder may get the family's own tokenizer class; make pairs with that tokenizer's view
    data = write_pairs(tmp_path / "pairs.jsonl", [("3 + 4 = ", "3 @ 4 = ", "7"), ("1 + 1 = ", "1 > 1 = ", "2")])
    out = tmp_path / "run"
    code = main(["patch", "--model", str(folder), "--data", str(data), "--out", str(out), "--metric", "logit-diff",
                 "--top-k", "3", "--threshold", "1e9", "--first-token"])
    assert code == 0
    for name in ("effects.json", "effects.csv", "key_heads.json", "heatmap.png", "per_sample.npz"):
        assert (out / name).is_file(), name
    assert len(json.loads((out / "key_heads.json").read_text())["heads"]) == 3
    assert main(["patch", "--model", str(folder), "--data", str(data), "--out", str(out), "--method", "nope"]) == 2


def test_attribution_run_reports_rank_correlation(model, tmp_path):
    from keyheads.patching import describe, identify

    data = write_pairs(tmp_path / "pairs.jsonl")
    found = identify(model, data, IdentifySettings(method="attribution", metric="logit-diff", top_k=2),
                     tmp_path / "run", progress=False)
    assert found.spearman_vs_path is not None and -1.0 <= found.spearman_vs_path <= 1.0
    assert (tmp_path / "run" / "attribution_vs_path.json").is_file()
    assert "Spearman" in describe(found)

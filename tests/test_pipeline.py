"""keyheads run / demo: every stage into one run folder, the report, and resuming."""
import json

import pytest

from keyheads import pipeline
from keyheads.pipeline import PipelineConfig, run_pipeline
from keyheads.testing import tiny_model

from tests.analysis.conftest import make_rows, write_rows
from tests.evaluation.conftest import tiny_data  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def test_pipeline_writes_every_stage_and_resumes(llama, tiny_data, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr("keyheads.models.load_model", lambda *a, **k: llama)
    out = tmp_path / "run"
    out.mkdir()
    # a random tiny model gets no sum right, so the data stage is given its output (and so is skipped)
    write_rows(out / "pairs.jsonl", make_rows(16))
    cfg = PipelineConfig(model="tiny", out=str(out), top_k=3, knockout_k=4, seeds=2, analysis_samples=None,
                         transfer_n=4, eval_benchmarks=["mmlu"], eval_limit=2, eval_few_shot=1,
                         data_dir=str(tiny_data), batch_size=8)
    report = run_pipeline(cfg)

    effects = json.loads((out / "identify" / "effects.json").read_text())
    ranked = sorted((v, l, h) for l, row in enumerate(effects["heads"]) for h, v in enumerate(row))[:3]
    keys = json.loads((out / "identify" / "key_heads.json").read_text())
    assert [k["label"] for k in keys["heads"]] == [f"{l}.{h}" for _, l, h in ranked]
    knock = json.loads((out / "knockout" / "knockout.json").read_text())
    assert knock["key_heads"]["heads"] == [k["label"] for k in keys["heads"]]
    assert knock["curves"]["k"] == list(range(5))
    for f in ("identify/heatmap.png", "knockout/knockout_curves.png", "attention/attention.json",
              "mlp/mlp.json", "eval/table.md"):
        assert (out / f).stat().st_size > 0, f
    text = report.read_text()
    for section in ("## 1. Identify", "## 2. Knockout", "## 3. Attention", "## 4. What the MLPs", "## 5. Evaluation"):
        assert section in text
    assert "](identify/heatmap.png)" in text and keys["heads"][0]["label"] in text

    # a second run finds every stage's output and computes nothing
    def fail(*a, **k):
        raise AssertionError("a finished stage ran again")

    for name in ("run_knockout", "run_attention", "run_mlp"):
        monkeypatch.setattr(f"keyheads.analysis.run.{name}", fail)
    monkeypatch.setattr("keyheads.patching.identify", fail)
    monkeypatch.setattr("keyheads.evaluation.evaluate", fail)
    assert run_pipeline(cfg).read_text() == text


def test_unknown_config_setting_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: smollm2-135m\ntop_kk: 5\n")
    with pytest.raises(ValueError, match="top_kk"):
        PipelineConfig.from_yaml(path)
    assert pipeline.PipelineConfig.from_yaml(write_cfg(tmp_path)).top_k == 4


def write_cfg(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("model: smollm2-135m\ntop_k: 4\n")
    return path

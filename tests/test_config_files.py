"""Every run config in configs/ parses into RunSettings, and the files it names are in the repository; the
lr-2e-5 rows of the Qwen study differ from the study in the learning rate and the variants alone, and take the
study's own key heads."""
from pathlib import Path

import pytest
import yaml

from keyheads.config.run import RunSettings

ROOT = Path(__file__).resolve().parents[1]
RUN_CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.yaml") if "model" in yaml.safe_load(p.read_text()))


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: p.stem)
def test_each_run_config_parses_and_names_files_that_exist(path, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # a config's paths are the repository's, as its header's command runs them
    settings = RunSettings.from_yaml(path, out=str(tmp_path / "run"), data_dir=str(tmp_path))
    raw = yaml.safe_load(path.read_text())
    assert settings.model == raw["model"]
    if raw.get("circuit"):
        assert (ROOT / raw["circuit"]).is_file(), raw["circuit"]


def test_the_lr_rows_are_the_study_at_the_paper_s_rate_with_the_study_s_key_heads():
    study, rows = (yaml.safe_load((ROOT / "configs" / f"{n}.yaml").read_text())
                   for n in ("study-qwen1.5b", "study-qwen1.5b-lr2e-5"))
    assert {k for k in study if study[k] != rows.get(k)} == {"out", "variants", "finetune", "knockout", "attention",
                                                            "mlp"}
    # the study takes Qwen2.5-Coder-0.5B's chosen rates; these rows one rate, the paper's
    assert {k for k in study["finetune"] | rows["finetune"]
            if study["finetune"].get(k) != rows["finetune"].get(k)} == {"lr", "lr_from"}
    assert rows["finetune"]["lr"] == 2e-5 and "lr_from" not in rows["finetune"]
    assert set(rows["variants"]) == {"full", "precise@10"} <= set(study["variants"])
    assert rows["circuit"].startswith("records/study-qwen1.5b/")


@pytest.mark.parametrize("first, single", [("first-token-smollm2", "single-token-smollm2"),
                                           ("first-token-qwen1.5b", "study-qwen1.5b")])
def test_a_first_token_config_differs_from_its_single_token_side_in_the_answer_filter_alone(first, single, tmp_path):
    a, b = (RunSettings.from_yaml(ROOT / "configs" / f"{n}.yaml", out="x", data_dir=str(tmp_path))
            for n in (first, single))
    assert a.model == b.model
    assert a.data.model_dump() == {**b.data.model_dump(), "single_token_answer": False}
    assert b.data.single_token_answer and a.identify.first_token and not b.identify.first_token
    assert a.identify.model_dump() == {**b.identify.model_dump(), "first_token": True}
    curves = ("k", "seeds", "seed", "limit", "mean")  # what the curves depend on
    assert [getattr(a.knockout, f) for f in curves] == [getattr(b.knockout, f) for f in curves]

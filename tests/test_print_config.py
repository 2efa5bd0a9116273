"""`keyheads run CONFIG --print-config` prints the resolved settings, each value with where it came from, as a
config that loads back to the same settings; it runs nothing."""
import yaml

from keyheads.cli import main
from keyheads.config.run import RunSettings


def test_every_value_with_its_source_and_the_text_loads_back(tmp_path, capsys):
    config = tmp_path / "study.yaml"
    config.write_text("model: smollm2-135m\nout: %s\ndata:\n  n: 40\n  single_token_answer: true\n"
                      "finetune:\n  lr: 2.0e-5\neval:\n  benchmarks: [arith-add]\n" % (tmp_path / "run"))
    assert main(["run", str(config), "--print-config", "--finetune.lr", "3e-4", "--identify.top-k", "6"]) == 0
    text = capsys.readouterr().out
    lines = {line.split(":")[0].strip(): line for line in text.splitlines()}
    assert lines["n"].endswith("40  # config file")
    assert lines["lr"].endswith("0.0003  # flag")  # the flag over the file's 2e-5
    assert lines["top_k"].endswith("6  # flag")
    assert lines["first_token"].endswith("false  # derived: on unless data.single_token_answer")
    assert lines["warmup_ratio"].endswith("# default")
    assert "  seed: 0  # derived: the run's seed" in text.splitlines()
    assert not (tmp_path / "run").exists()  # nothing ran
    printed = yaml.safe_load(text)
    want = RunSettings.from_yaml(config, finetune={"lr": 3e-4}, identify={"top_k": 6})
    assert RunSettings.make(**printed).to_json() == want.to_json()


def test_the_demo_says_which_values_are_its_own(capsys):
    assert main(["demo", "--print-config", "--knockout.k", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  k: 5  # flag" in lines
    assert "  n: 96  # demo" in lines
    assert "  method: path  # default" in lines


def test_a_run_s_defaults_are_on_its_section_types_and_what_follows_is_a_validator():
    """A section given in part keeps the run's defaults, which its type declares; the seed and the values that follow
    from other sections are set by RunSettings' validator, and a value given is kept."""
    import pytest

    from keyheads.analysis.settings import AttentionSettings, KnockoutSettings, MLPSettings
    from keyheads.data.settings import PairSettings
    from keyheads.errors import SettingError
    from keyheads.evaluation.settings import EvalSettings
    from keyheads.patching.settings import IdentifySettings

    def make(**values):
        return RunSettings.make(eval={"benchmarks": ["arith-add"], **values.pop("eval", {})}, **values)

    cfg = make(data={"n": 40}, attention={"seed": 0}, seed=0)
    # one default per setting: a run's section is its step's settings type itself, the command's defaults and all
    sections = {"data": PairSettings, "identify": IdentifySettings, "knockout": KnockoutSettings,
                "attention": AttentionSettings, "mlp": MLPSettings, "eval": EvalSettings}
    assert {name: type(getattr(cfg, name)) for name in sections} == sections
    assert cfg.data.n == 40 and cfg.data.keep_correct is PairSettings.model_fields["keep_correct"].default
    assert cfg.attention.limit == AttentionSettings.model_fields["limit"].default
    assert make(seed=3).knockout.seed == 3 and make(seed=3).data.seed == 3
    with pytest.raises(SettingError, match="a run has one seed"):
        make(seed=3, knockout={"seed": 4})
    assert make(data={"single_token_answer": True}).identify.first_token is False
    assert make(data={"single_token_answer": True}, identify={"first_token": True}).identify.first_token is True
    assert make().identify.first_token is True
    assert make().eval.split == "full"
    assert make(eval={"split": "heldout"}).eval.split == "heldout"

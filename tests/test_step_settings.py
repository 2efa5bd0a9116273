"""Every setting of every step of a run reaches its step and its stage signature, with no list kept by hand.

The walk goes over each field of each step's section of the run config, changes it to another valid value,
and checks both paths: the stage's recorded settings change (so a changed setting re-runs the stage), and the
step is called with the new value (so a hashed setting is also a used one). Cutting either path (a field
dropped from the signature, or from what the stage passes) fails the walk for that field.
"""
import dataclasses
import types
import typing
from types import SimpleNamespace

import pytest
from pydantic import BaseModel

from keyheads import pipeline
from keyheads.components import Components
from keyheads.config.run import RunSettings, merge_settings
from keyheads.data.trainset import SplitSettings
from keyheads.finetune.settings import FinetuneSection, FinetuneSettings
from keyheads.heads import Head
from keyheads.models import Placement
from keyheads.selection import HeadChoice

VARIANTS = ["precise", "precise+mlp", "full", "lora"]
# single-token answers, so that identify.first_token can take either value (first-token data needs it on)
BASE = dict(model="tiny", variants=VARIANTS, finetune=dict(train="arith:multidigit:8"),
            eval=dict(benchmarks=["arith-add"]), identify=dict(top_k=3), data=dict(single_token_answer=True))

# a value the generic rule below cannot make (a valid string of a particular form)
OTHER = {
    ("data", "task"): "subtraction",
    ("data", "templates"): ["add-eq-1"],
    ("data", "template_files"): ["builtin"],
    ("data", "a_range"): (2, 9),
    ("data", "b_range"): (2, 9),
    ("identify", "method"): "activation",
    ("identify", "metric"): "logit-diff",
    ("mlp", "case"): "2 + 2 = ",
    ("mlp", "case_answer"): "4",
    ("finetune", "train"): "arith:decimal:8",
    ("finetune", "adam_betas"): (0.8, 0.99),
    ("eval", "benchmarks"): ["arith-mul"],
    ("eval", "split"): "heldout",
    ("eval", "heldout"): SplitSettings(seed=1),
}
# settings that a resumed run may change without changing any result (declared on the type itself)
RESUMABLE = {("finetune", name) for name in FinetuneSettings.RESUMABLE_CHANGES}
# filled in by the run config from elsewhere, not settable in the section; and the learning-rate grid's settings,
# which reach the grid's own stages (tests/test_study_cells.py walks them on a tiny study)
NOT_SETTABLE = {"seed", *FinetuneSection.RATE_CHOICE}


def other_value(section: str, name: str, annotation, default):
    """A valid value different from `default`."""
    if (section, name) in OTHER:
        return OTHER[section, name]
    kind = annotation
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if typing.get_origin(kind) is typing.Annotated:  # Count = Annotated[int, Field(ge=1)]
        kind = typing.get_args(kind)[0]
    if typing.get_origin(kind) is typing.Literal:
        return next(v for v in typing.get_args(kind) if v != default)
    if kind is bool:
        return not default
    if kind is int:
        return 2 if default is None else default + 1
    if kind is float:
        return 0.5 if default is None else (default * 2 if default else 0.5)
    raise AssertionError(f"add {section}.{name} ({annotation}) to OTHER")


def section_fields():
    """(section, field name, YAML key, annotation) of every step's settings in the run config."""
    cfg = RunSettings.make(**BASE)
    for section in ("data", "identify", "knockout", "attention", "mlp", "finetune", "eval"):
        kind = type(getattr(cfg, section))
        for name, info in kind.model_fields.items():
            if name not in NOT_SETTABLE:
                yield section, name, info.alias or name, info.annotation


class Calls:
    """Records what each step was called with."""

    def __init__(self, monkeypatch):
        self.args: list = []
        model = SimpleNamespace(hf=None, tokenizer=None, name="tiny", source="tiny", n_layers=2, n_heads=4)
        self.model = model

        def record(result=None):
            def step(*args, **kwargs):
                self.args.extend(args)
                self.args.extend(kwargs.values())
                self.args.extend(f"{k}={v}" for k, v in kwargs.items())
                return result
            return step

        for name in ("run_knockout", "run_attention", "run_mlp", "evaluate", "write_pairs", "describe_effects",
                     "describe_knockout", "describe_attention", "describe_mlp",
                     "describe_training", "write_html_report"):
            monkeypatch.setattr(pipeline, name, record())
        monkeypatch.setattr(pipeline, "pairs_for", record(["a pair"]))
        monkeypatch.setattr(pipeline, "identify", record((None, None)))
        monkeypatch.setattr(pipeline, "finetune", record())
        monkeypatch.setattr(pipeline, "load_examples", record([]))
        monkeypatch.setattr(pipeline.models, "load_placed", lambda *a, **k: (model, Placement("cpu", "cpu")))
        monkeypatch.setattr(pipeline, "key_heads", lambda run: Components((Head(0, 0), Head(1, 1))))
        monkeypatch.setattr(pipeline, "_key_heads", lambda run: HeadChoice(heads="0.0,1.1"))
        monkeypatch.setattr(pipeline, "variant_components", lambda variant, run, model, cfg: Components(
            (Head(0, 0),), (cfg.finetune.mlps,) if "+mlp" in variant else ()))

    def reached(self, key: str, name: str, value) -> bool:
        """Whether some argument of the step holds `value` as `name` (or is it)."""
        want = list(value) if isinstance(value, tuple) else value
        for arg in self.args:
            for field in (name, key):
                held = _field(arg, field)
                if held is not _MISSING and (list(held) if isinstance(held, tuple) else held) == want:
                    return True
            if arg == value or arg == f"{name}={value}":
                return True
            if isinstance(arg, Components) and name == "mlps" and value in arg.mlps:
                return True
        return False


_MISSING = object()


def _field(obj, name):
    if dataclasses.is_dataclass(obj) or isinstance(obj, BaseModel):
        return getattr(obj, name, _MISSING)
    return _MISSING


def stages_of(cfg, run, calls):
    return {s.name: s for s in pipeline.build_stages(cfg, run, lambda: calls.model, progress=False)}


@pytest.mark.parametrize("section,name,key,annotation", list(section_fields()),
                         ids=[f"{s}.{n}" for s, n, _, _ in section_fields()])
def test_every_setting_reaches_its_step_and_its_signature(section, name, key, annotation, tmp_path, monkeypatch):
    base = RunSettings.make(out=str(tmp_path / "a"), **BASE)
    default = getattr(getattr(base, section), name)
    value = other_value(section, name, annotation, default)
    changed = RunSettings.make(out=str(tmp_path / "b"), **merge_settings(BASE, {section: {key: value}}))
    assert getattr(getattr(changed, section), name) != default, "the walk must change the setting"

    calls = Calls(monkeypatch)
    before = stages_of(base, tmp_path / "a", calls)
    after = stages_of(changed, tmp_path / "b", calls)
    group = {"identify": "identify"}.get(section, section)
    names = [n for n in after if n.split("/")[0] == group]
    assert names, f"no stage runs the {section} step"

    differs = [n for n in names if before[n].settings != after[n].settings]
    if (section, name) in RESUMABLE:
        assert not differs, f"{section}.{name} changes no result, so no stage signature"
    else:
        assert differs, f"{section}.{name} changes no stage signature: a changed value would not re-run its stage"

    for n in (differs or names):
        after[n].run()
    assert calls.reached(key, name, value), f"{section}.{name} = {value!r} never reaches its step"


def test_the_walk_fails_when_a_stage_drops_a_setting(tmp_path, monkeypatch):
    """The walk can fail: a stage that passes a copy without the field is caught."""
    calls = Calls(monkeypatch)
    cfg = RunSettings.make(out=str(tmp_path / "a"), **merge_settings(BASE, {"knockout": {"k": 7}}))
    monkeypatch.setattr(pipeline, "_knockout", lambda cfg, run, model, progress=True: pipeline.run_knockout(
        model, run, run, None, cfg.knockout.model_copy(update={"k": 20})))
    stages_of(cfg, tmp_path / "a", calls)["knockout"].run()
    assert not calls.reached("k", "k", 7)

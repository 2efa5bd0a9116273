"""keyheads run / demo: every stage into one run folder, stage records, staleness, selection,
reproducibility and up-front validation of every setting."""
import html
import json
import logging
import re
import shutil
from pathlib import Path

import pytest

from keyheads.config.run import RunSettings, merge_settings
from keyheads.errors import BadFile, UserError
from keyheads.evaluation.cache import read_rows
from keyheads.pipeline import run_pipeline
from keyheads.testing import tiny_model

from tests.helpers import make_rows, write_rows

pytestmark = pytest.mark.slow  # whole pipelines, up to about 30 s each

STAGES = ["data", "identify", "knockout", "attention", "mlp", "finetune--precise", "eval", "report"]


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def config(run, data_dir, **kw):
    base = dict(model="tiny", out=str(run), identify=dict(top_k=3),
                knockout=dict(k=4, seeds=2, limit=None, transfer_n=4),
                attention=dict(limit=None), mlp=dict(limit=None), variants=["precise"],
                finetune=dict(train=str(run.parent / "train.jsonl"), max_steps=2, optimizer_batch_size=4,
                              micro_batch_size=2),
                eval=dict(benchmarks=["mmlu"], limit=2, few_shot=1), data_dir=str(data_dir), batch_size=8)
    return RunSettings.make(**merge_settings(base, kw))


def given_pairs(cfg, run, model, progress=True):
    # a random tiny model gets no sum right, so the data stage would keep nothing: it writes fixed pairs
    write_rows(run / "pairs.jsonl", make_rows(16))


@pytest.fixture
def run(tmp_path, llama, monkeypatch):
    # each load is a fresh copy, as from disk: training changes its copy's weights in place
    monkeypatch.setattr("keyheads.models.loading.load_model", lambda *a, **k: tiny_model("llama"))
    out = tmp_path / "run"
    out.mkdir()
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"prompt": f"{a} + 1 = ", "completion": str(a + 1)})
                                                  + "\n" for a in range(8)))
    return out


@pytest.fixture
def said(caplog):
    """The run's progress notes (logged, as the library does; the command shows them)."""
    caplog.set_level(logging.INFO, logger="keyheads")
    return caplog


def ran(caplog):
    lines = [line for m in caplog.messages for line in m.splitlines()]
    caplog.clear()
    return [line.split("]")[0][1:] for line in lines
            if line.startswith("[") and "] running" in line]


def test_every_stage_writes_its_outputs_and_record(run, tiny_data, said, monkeypatch):  # noqa: F811
    monkeypatch.setattr("keyheads.pipeline._data", given_pairs)
    report = run_pipeline(config(run, tiny_data))
    assert ran(said) == [s.replace("--", "/") for s in STAGES]
    assert report == run / "report.html" and report.stat().st_size > 0
    keys = json.loads((run / "identify" / "key_heads.json").read_text())
    effects = json.loads((run / "identify" / "effects.json").read_text())
    ranked = sorted((v, l, h) for l, row in enumerate(effects["heads"]) for h, v in enumerate(row))[:3]
    assert [k["label"] for k in keys["heads"]] == [f"{l}.{h}" for _, l, h in ranked]
    # every later stage took the key heads from key_heads.json
    knock = json.loads((run / "knockout" / "knockout.json").read_text())
    assert knock["key_heads"]["heads"] == [{"layer": k["layer"], "head": k["head"]} for k in keys["heads"]]
    ft = json.loads((run / "finetune" / "precise" / "finetune.json").read_text())
    assert sorted((h["layer"], h["head"]) for h in ft["components"]["heads"]) == sorted(
        (k["layer"], k["head"]) for k in keys["heads"]
    )
    rows = json.loads((run / "eval" / "results.json").read_text())["variants"]
    assert len(rows) == 3 and any("precise SFT" in r["label"] for r in rows)
    assert any((run / "eval" / "cache").iterdir())  # the evaluation cache lives in the run folder
    for name in STAGES:
        rec = json.loads((run / "stages" / f"{name}.json").read_text())
        assert rec["outputs"] and all(rec["outputs"].values()) and rec["seconds"] >= 0
    written = json.loads((run / "config.json").read_text())
    assert written["identify"]["top_k"] == 3 and RunSettings.make(**written) == config(run, tiny_data)
    assert json.loads((run / "model.json").read_text())["fingerprint"]


def test_rerun_is_instant_and_a_change_reruns_exactly_its_dependents(run, tiny_data, said, monkeypatch):  # noqa: F811
    monkeypatch.setattr("keyheads.pipeline._data", given_pairs)
    run_pipeline(config(run, tiny_data))
    said.clear()

    def fail(*a, **k):
        raise AssertionError("an up-to-date stage ran again")

    monkeypatch.setattr("keyheads.models.loading.load_model", fail)  # nothing to do: the model is not even loaded
    run_pipeline(config(run, tiny_data))
    assert ran(said) == []
    monkeypatch.setattr("keyheads.models.loading.load_model", lambda *a, **k: tiny_model("llama"))

    run_pipeline(config(run, tiny_data, knockout=dict(k=3)))
    assert ran(said) == ["knockout", "report"]
    run_pipeline(config(run, tiny_data, knockout=dict(k=3), finetune=dict(lr=1e-3)))
    assert ran(said) == ["finetune/precise", "eval", "report"]
    run_pipeline(config(run, tiny_data, knockout=dict(k=3), finetune=dict(lr=1e-3), identify=dict(top_k=2)))
    assert ran(said) == ["identify", "knockout", "attention", "finetune/precise", "eval", "report"]  # not data, mlp
    out = run_pipeline(config(run, tiny_data, knockout=dict(k=3), finetune=dict(lr=1e-3), identify=dict(top_k=2),
                              batch_size=4))
    assert ran(said) == ["report"]  # a batch size changes speed, not results
    assert out.exists()


def test_stages_and_from_choose_a_subset(run, tiny_data, said, monkeypatch):  # noqa: F811
    monkeypatch.setattr("keyheads.pipeline._data", given_pairs)
    with pytest.raises(FileNotFoundError, match="stage identify needs pairs.jsonl"):
        run_pipeline(config(run, tiny_data, variants=[], eval=dict(benchmarks=[])), stages=["identify"])
    said.clear()
    run_pipeline(config(run, tiny_data, variants=[], eval=dict(benchmarks=[])), stages=["data", "identify", "mlp"])
    assert ran(said) == ["data", "identify", "mlp"]
    run_pipeline(config(run, tiny_data, variants=[], eval=dict(benchmarks=[])), start="attention")
    assert ran(said) == ["attention", "report"]
    assert not (run / "knockout" / "knockout.json").exists()
    with pytest.raises(ValueError, match="unknown stage 'identfy'"):
        run_pipeline(config(run, tiny_data), stages=["identfy"])


def test_finetune_variant_names_choose_heads_and_mlps(run, tiny_data, llama, monkeypatch):  # noqa: F811
    from keyheads.pipeline import key_heads, variant_components

    monkeypatch.setattr("keyheads.pipeline._data", given_pairs)
    cfg = config(run, tiny_data, variants=[], eval=dict(benchmarks=[]), identify=dict(top_k=3), finetune=dict(mlps=2))
    run_pipeline(cfg, stages=["data", "identify"])
    effects = json.loads((run / "identify" / "effects.json").read_text())
    ranked = [(l, h) for _, l, h in sorted((v, l, h) for l, row in enumerate(effects["heads"])
                                               for h, v in enumerate(row))]
    mlps = [l for _, l in sorted((v, l) for l, v in enumerate(effects["mlps"]))]

    def chosen(name):
        c = variant_components(name, run, llama, cfg)
        return sorted(c.heads), sorted(c.mlps)

    assert chosen("precise") == (sorted(key_heads(run).heads), [])
    assert chosen("precise@5") == (sorted(ranked[:5]), [])
    assert chosen("precise+mlp") == (sorted(key_heads(run).heads), sorted(mlps[:2]))
    assert chosen("precise@2+mlp1") == (sorted(ranked[:2]), mlps[:1])
    heads, none = chosen("random@4")
    assert len(heads) == 4 and none == [] and chosen("random@4") == (heads, [])  # seeded
    assert len(chosen("random")[0]) == 3
    # -seedN draws with seed N: the run's own seed (0) gives random@4's heads, others other draws
    from keyheads.components import Components

    assert chosen("random@4-seed0") == (heads, [])
    for seed in (1, 2):
        drawn = Components.random_heads(4, llama.n_layers, llama.n_heads, seed=seed)
        assert chosen(f"random@4-seed{seed}") == (sorted(drawn.heads), [])
    assert chosen("random@4-seed1") != chosen("random@4-seed2")


def test_same_config_and_seed_give_byte_identical_results(run, tiny_data, monkeypatch):  # noqa: F811
    monkeypatch.setattr("keyheads.pipeline._data", given_pairs)
    cfg = config(run, tiny_data, eval=dict(benchmarks=[]))
    run_pipeline(cfg)
    files = ["identify/effects.json", "identify/key_heads.json", "knockout/knockout.json",
             "finetune/precise/adapter.safetensors"]
    first = {f: (run / f).read_bytes() for f in files}
    for folder in ("identify", "knockout", "finetune", "stages"):
        shutil.rmtree(run / folder)
    run_pipeline(cfg)
    for f in files:
        assert (run / f).read_bytes() == first[f], f"{f} differs between two runs of the same config"


@pytest.mark.parametrize("change, affected", [
    ({"data": {"few_shot": 1}}, {"data"}),
    ({"identify": {"metric": "prob"}}, {"identify"}),
    ({"knockout": {"mean": "global"}}, {"knockout", "eval"}),
    ({"attention": {"limit": 7}}, {"attention"}),
    ({"mlp": {"case_answer": "8"}}, {"mlp"}),
    ({"finetune": {"warmup_ratio": 0.1}}, {"finetune/precise"}),
    ({"eval": {"few_shot": 2}}, {"eval"}),
    ({"seed": 3}, {"data", "knockout", "attention", "mlp", "finetune/precise", "eval"}),
    ({"batch_size": 4, "finetune": {"save_every": 1}}, set()),  # speed and checkpoints, not results
])
def test_a_stage_signature_is_its_section(change, affected, tmp_path):
    """Every setting of a section reaches its stage's signature, and no other stage's."""
    from keyheads.pipeline import build_stages

    def signatures(cfg):
        return {s.name: s.settings for s in build_stages(cfg, tmp_path, get_model=None)}

    (tmp_path / "train.jsonl").write_text('{"prompt": "1 + 1 = ", "completion": "2"}\n')
    before = signatures(config(tmp_path / "r", tmp_path))
    after = signatures(config(tmp_path / "r", tmp_path, **change))
    assert {name for name in before if before[name] != after[name]} == affected


def test_signatures_do_not_depend_on_the_number_of_processes(tmp_path, monkeypatch):
    """What a stage's signature holds comes from the config alone, never from the launcher."""
    from keyheads import distributed
    from keyheads.pipeline import build_stages

    (tmp_path / "train.jsonl").write_text('{"prompt": "1 + 1 = ", "completion": "2"}\n')
    cfg = config(tmp_path / "r", tmp_path, variants=["precise", "lora"])

    def stages():
        return [(s.name, s.settings, s.inputs, s.owns, s.resume) for s in build_stages(cfg, tmp_path, get_model=None)]

    one = stages()
    monkeypatch.setenv("WORLD_SIZE", "4")
    for name, value in (("world", 4), ("rank", 3), ("is_main", False), ("default_device", "cuda:3")):
        monkeypatch.setattr(distributed, name, lambda value=value: value)
    assert stages() == one


def test_a_batch_that_does_not_split_over_the_processes_is_refused_up_front(run, tiny_data, monkeypatch):  # noqa: F811
    from keyheads import distributed

    monkeypatch.setattr(distributed, "world", lambda: 3)
    with pytest.raises(UserError, match="finetune.optimizer_batch_size: 4 given; does not split over the 3 "
                                        "processes; use a multiple of 3"):
        run_pipeline(config(run, tiny_data))
    assert not (run / "config.json").exists()  # before anything ran


@pytest.mark.parametrize("values, named", [
    ({"data": {"n": 0}}, "data.n: 0 given"),
    ({"identify": {"top_k": -3}}, "identify.top_k: -3 given"),
    ({"batch_size": 0}, "batch_size: 0 given"),
    ({"knockout": {"k": True}}, "knockout.k: True given"),
    ({"knockout": {"seeds": "five"}}, "knockout.seeds: 'five' given"),
    ({"finetune": {"lr": 0}}, "finetune.lr: 0 given"),
    ({"identify": {"method": "magic"}}, "identify.method: 'magic' given"),
    ({"identify": {"metric": "accuracy"}}, "identify.metric: 'accuracy' given"),
    ({"variants": ["precise", "everything"]}, "unknown variant(s) everything"),
    ({"variants": ["random@3+mlp"]}, "unknown variant(s) random@3+mlp"),
    ({"variants": ["precise@3-seed1"]}, "unknown variant(s) precise@3-seed1"),
    ({"variants": ["full", "full"]}, "a variant is listed twice"),
    ({"data": {"task": "integration"}}, "data.task: 'integration' given"),
    ({"data": {"templates": ["add-eq-99"]}}, "data.templates: ['add-eq-99'] given; unknown template id(s) add-eq-99"),
    ({"eval": {"benchmarks": ["gsm9k"]}}, "gsm9k"),
    ({"device": "cuda:7"}, "device"),
    ({"device": "tpu"}, "device"),
    ({"dtype": "float8"}, "dtype"),
    ({"data_dir": "/no/such/folder"}, "data_dir: '/no/such/folder' given"),
    ({"top_kk": 3}, "top_kk"),
    ({"finetune": {"batch_size": 4}}, "finetune.batch_size: 4 given; unknown setting"),  # optimizer_batch_size
    ({"finetune": {"train": "arith:multidigit,nope"}},
     "finetune.train: 'arith:multidigit,nope' given; unknown arithmetic kind 'nope'; known: multidigit"),
])
def test_invalid_settings_are_named_before_anything_runs(values, named, tmp_path):
    with pytest.raises(UserError, match=re.escape(named)) as err:
        RunSettings.make(**merge_settings({"out": str(tmp_path / "r"), "eval": {"benchmarks": []}}, values))
    assert "ArgsKwargs" not in str(err.value) and "pydantic" not in str(err.value)


def test_a_section_given_in_part_keeps_its_type_s_defaults(tmp_path):
    """A run's section is its step's settings type: the settings not given are that type's defaults, the command's."""
    from keyheads.analysis.settings import AttentionSettings, KnockoutSettings, MLPSettings
    from keyheads.data.settings import PairSettings
    from keyheads.evaluation.settings import EvalSettings
    from keyheads.patching.settings import IdentifySettings

    cfg = RunSettings.make(out=str(tmp_path / "r"), eval={"benchmarks": []}, data={"task": "all"})
    assert (cfg.data.task, cfg.data.few_shot) == ("all", 0)
    for section, kind in (("data", PairSettings), ("identify", IdentifySettings), ("knockout", KnockoutSettings),
                          ("attention", AttentionSettings), ("mlp", MLPSettings), ("eval", EvalSettings)):
        given = getattr(cfg, section)
        for name in ("n", "keep_correct", "top_k", "threshold", "limit"):
            if name in kind.model_fields:
                assert getattr(given, name) == kind.model_fields[name].default, (section, name)
    assert cfg.identify.first_token is True  # what follows from the data: its answers are scored by first token
    assert cfg.eval.split == "full"  # no variant trains on trainset


def test_out_that_cannot_be_written_and_missing_config_are_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match="out"):
        RunSettings.make(out=str(blocker / "run"), eval={"benchmarks": []})
    with pytest.raises(BadFile, match="nothere.yaml"):
        RunSettings.from_yaml(tmp_path / "nothere.yaml")
    path = tmp_path / "c.yaml"
    path.write_text("model: smollm2-135m\ntop_kk: 5\n")
    with pytest.raises(UserError, match="top_kk"):
        RunSettings.from_yaml(path)
    path.write_text(f"out: {tmp_path / 'r'}\nidentify:\n  top_k: 4\neval:\n  benchmarks: []\n")
    assert RunSettings.from_yaml(path).identify.top_k == 4


def test_benchmarks_that_need_data_are_refused_without_a_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("KEYHEADS_DATA", raising=False)
    with pytest.raises(UserError, match="eval.benchmarks gsm8k read a benchmark folder"):
        RunSettings.make(out=str(tmp_path / "r"), eval={"benchmarks": ["gsm8k"]})


def test_cli_run_flags_override_the_yaml_and_errors_exit_2(tmp_path, capsys):
    from keyheads.cli import main

    path = tmp_path / "c.yaml"
    path.write_text(f"out: {tmp_path / 'r'}\nidentify: {{top_k: 4}}\neval: {{benchmarks: []}}\n")
    assert main(["run", str(path), "--identify.top-k", "0"]) == 2
    err = capsys.readouterr().err
    assert "identify.top_k: '0' given; must be an integer >= 1" in err and "Traceback" not in err
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert main(["demo", "--device", "cuda:3"]) == 2
    assert "device" in capsys.readouterr().err


@pytest.mark.parametrize("text, said", [
    ("model: [smollm2-135m\nout: runs/x\n", "not valid YAML at line 2"),  # an unclosed bracket
    ("identify:\n  top_k: 4\n   threshold: -0.1\n", "not valid YAML at line 3"),  # a misindented key
    ("finetune:\n  train: arith:multidigit,fractions\n", "finetune.train: 'arith:multidigit,fractions' given; "
                                                          "unknown arithmetic kind 'fractions'"),
])
def test_cli_run_with_a_broken_config_says_one_line(text, said, tmp_path, capsys):
    from keyheads.cli import main

    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert main(["run", str(path), "--out", str(tmp_path / "r"), "--eval.benchmarks", "arith-add"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"keyheads run: error: {path}: ") and said in err, err
    assert "\n" not in err and "Traceback" not in err and "ArgsKwargs" not in err


def test_cli_run_flags_reach_the_sections(tmp_path, monkeypatch):
    from keyheads.cli import main

    seen = {}
    monkeypatch.setattr("keyheads.pipeline.run_pipeline", lambda cfg, **kw: seen.update(cfg=cfg, **kw))
    assert main(["run", "--out", str(tmp_path / "r"), "--eval.benchmarks", "arith-add,arith-sub",
                 "--finetune.optimizer-batch-size", "32", "--knockout.limit", "null", "--knockout.k",
                 "7", "--variants", "precise,random@2", "--identify.top-k", "4", "--quiet"]) == 0
    cfg = seen["cfg"]
    assert cfg.eval.benchmarks == ("arith-add", "arith-sub") and cfg.finetune.optimizer_batch_size == 32
    assert cfg.knockout.limit is None and cfg.knockout.k == 7 and cfg.variants == ["precise", "random@2"]
    assert seen["progress"] is False


def test_training_on_the_trainset_evaluates_only_untrained_items(run, tiny_data, monkeypatch):  # noqa: F811
    from keyheads.data.trainset import SplitSettings, heldout_splits
    from keyheads.finetune import load_examples

    monkeypatch.setattr("keyheads.pipeline._data", given_pairs)
    data = run.parent / "benchmarks"
    shutil.copytree(tiny_data, data)
    # distinct questions, so that the trainset (GSM8K train + SVAMP's training part) is not empty
    (data / "gsm8k" / "train.jsonl").write_text("".join(
        json.dumps({"question": f"Tom has {a} pens and buys 2 more. How many pens?", "answer": f"#### {a + 2}"}) + "\n"
        for a in range(3)))
    (data / "svamp" / "SVAMP.json").write_text(json.dumps(
        [{"ID": f"chal-{i}", "Body": f"Bob had {i} cards.", "Question": "He lost 1. How many cards now?",
          "Equation": f"( {i} - 1 )", "Answer": i - 1, "Type": "Subtraction"} for i in range(8)]))
    cfg = config(run, data, finetune=dict(train="trainset"), eval=dict(benchmarks=["svamp"], limit=None, few_shot=0))
    assert cfg.eval.split == "heldout"
    run_pipeline(cfg, stages=["data", "identify", "finetune", "eval"])
    res = json.loads((run / "eval" / "results.json").read_text())["variants"][0]["benchmarks"]["svamp"]
    held = heldout_splits(str(data), SplitSettings())["svamp"][1]
    trained = {e.prompt for e in load_examples("trainset", data_dir=str(data))}
    assert res["split"].startswith("heldout") and 0 < res["n"] == len(held) < 8
    assert not any(r.question in p for r in held for p in trained)
    # asked for explicitly, or with other training data, the whole set as in the paper
    assert config(run, data, finetune=dict(train="trainset"), eval=dict(split="full")).eval.split == "full"
    assert config(run, data).eval.split == "full"


@pytest.mark.parametrize("command", ["run", "demo"])
def test_help_prints_every_setting(command, capsys):
    from keyheads.cli import main

    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    text = capsys.readouterr().out
    assert (
        done.value.code == 0 and "-5%" in text and "--eval.split" in text and "--finetune.optimizer-batch-size" in text
    )


def test_keyheads_eval_adapter_reproduces_a_run_row(run, tiny_data, monkeypatch, tmp_path):  # noqa: F811
    from keyheads.cli import main

    monkeypatch.setattr("keyheads.pipeline._data", given_pairs)
    cfg = config(run, tiny_data, variants=["precise", "lora"], eval=dict(benchmarks=["mmlu", "arith-add"], limit=3))
    run_pipeline(cfg, stages=["data", "identify", "finetune", "eval"])
    rows = {r["label"]: r for r in json.loads((run / "eval" / "results.json").read_text())["variants"]}
    for variant in ("precise", "lora"):
        out, cache = tmp_path / f"again-{variant}", tmp_path / f"cache-{variant}"  # a fresh cache: recomputed
        assert (
            main(
                [
                    "eval",
                    "--adapter",
                    str(run / "finetune" / variant),
                    "--no-base",
                    "--benchmarks",
                    "mmlu,arith-add",
                    "--limit",
                    "3",
                    "--few-shot",
                    "1",
                    "--batch-size",
                    "8",
                    "--data-dir",
                    str(tiny_data),
                    "--out",
                    str(out),
                    "--cache-dir",
                    str(cache),
                    "--quiet",
                ]
            )
            == 0
        )
        again = json.loads((out / "results.json").read_text())["variants"][0]
        row = rows[f"tiny + {variant} SFT"]
        for bench in ("mmlu", "arith-add"):
            assert {k: again["benchmarks"][bench][k] for k in ("accuracy", "n", "ci95")} == \
                   {k: row["benchmarks"][bench][k] for k in ("accuracy", "n", "ci95")}
        # item by item: the same scores and generations as the run's own evaluation
        for bench in ("mmlu", "arith-add"):
            assert cached(cache / f"{bench}.sqlite") == cached(run / "eval" / "cache" / f"{bench}.sqlite",
                                                              f"tiny + {variant} SFT")


def cached(path, label=None) -> list[str]:
    """The per-item results of an evaluation cache (of one row label), without key and label."""
    rows = read_rows(path)
    return sorted(json.dumps({k: v for k, v in r.items() if k not in ("key", "variant")}, sort_keys=True)
                  for r in rows if label is None or r["variant"] == label)


def test_the_finetune_stage_loads_as_keyheads_finetune_and_holds_no_analysis_model(run, tiny_data,  # noqa: F811
                                                                                  monkeypatch):
    """The run's training loads its model through the call `keyheads finetune` makes, with the same placement,
    and the analysis model is let go first: a process never holds the model twice."""
    import gc
    import weakref

    from keyheads import models
    from keyheads.cli import main

    monkeypatch.setattr("keyheads.pipeline._data", given_pairs)
    loads, alive_at_training = [], []
    real = models.load_placed

    def recorded(name, device=None, dtype=None, **kw):
        gc.collect()
        alive_at_training.append([ref() is not None for ref in loaded])
        loads.append((name, device, dtype, kw.get("sharded", False)))
        model, where = real(name, device, dtype, **kw)
        loaded.append(weakref.ref(model))
        return model, where

    loaded: list = []
    monkeypatch.setattr(models, "load_placed", recorded)
    folder = run.parent / "model"  # a model folder, which FSDP2 training reads shard by shard
    saved = tiny_model("llama")
    saved.hf.save_pretrained(folder)
    saved.tokenizer.save_pretrained(folder)
    cfg = config(run, tiny_data, model=str(folder), eval=dict(benchmarks=[]), finetune=dict(parallel="fsdp"))
    run_pipeline(cfg, stages=["data", "identify", "finetune"])
    assert len(loads) == 2  # the analysis model, then the training copy
    assert alive_at_training[1] == [False]  # the analysis model was gone when training loaded its copy
    trained = json.loads((run / "finetune" / "precise" / "finetune.json").read_text())
    assert trained["train"]["parallel"] == "fsdp" and len(trained["train"]["losses"]) == 2
    # the same call `keyheads finetune --parallel fsdp` makes
    seen = []
    monkeypatch.setattr(models, "load_placed", lambda *a, **k: seen.append((*a, k.get("sharded"))) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main(["finetune", "--model", cfg.model, "--parallel", "fsdp", "--train", cfg.finetune.train,
              "--out", str(run.parent / "ft"), "--heads", "0.0"])
    assert seen == [loads[1]]


@pytest.mark.real_model
def test_the_ioi_example_config_runs_and_its_report_names_the_key_heads_it_found(tmp_path, monkeypatch):
    """configs/ioi-smollm2.yaml on the bundled SmolLM2, from the repository root as the README runs it: pairs
    from templates whose answer is a slot's value, identify, knockout, precise SFT and the report."""
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)  # the config's template and training files are relative to the root
    out = tmp_path / "ioi"
    report = run_pipeline(RunSettings.from_yaml("configs/ioi-smollm2.yaml", out=str(out)), progress=False)
    assert sorted(p.stem for p in (out / "stages").glob("*.json")) == [
        "data", "finetune--precise", "identify", "knockout", "report"]  # no attention or MLP stage
    pairs = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    assert pairs and all(p["task"] == "ioi" and p["reference"].count(p["answer"]) == 1
                         and p["counterfactual"] != p["reference"] for p in pairs)

    keys = json.loads((out / "identify" / "key_heads.json").read_text())
    labels = [k["label"] for k in keys["heads"]]
    assert len(labels) == 4  # identify.top_k
    knock = json.loads((out / "knockout" / "knockout.json").read_text())
    assert [f"{h['layer']}.{h['head']}" for h in knock["key_heads"]["heads"]] == labels
    page = report.read_text()
    assert f"{len(labels)} key heads of {keys['n_heads_total']}: {', '.join(labels)}" in page  # the opening facts
    table = re.search(r'<table class="sortable key-heads">(.*?)</table>', page, re.S)
    assert table, "no key-heads table in the report"
    assert re.findall(r"<tr><td[^>]*>\d+</td><td>([\d.]+)</td>", table.group(1)) == labels  # in rank order
    # a report in its task's words: it names the task, never the paper's, and judges only the claims that apply
    assert "arithmetic" not in page.lower() and "behind the task “ioi”" in page
    assert "claims 4, 5, 6, 7, 9, 11 of the paper's findings table are skipped" in html.unescape(page)
    assert "Knocking out the key heads breaks the task" in page and "Precise SFT trains faster" in page

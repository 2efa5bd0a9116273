"""`keyheads finetune` and `keyheads merge` end to end on a tiny model folder; input errors said before work."""
import json

import pytest

from keyheads.cli import main
from keyheads.testing import tiny_model

pytestmark = pytest.mark.slow  # training runs through the CLI, several seconds each

STEPS = ["--max-steps", "2", "--optimizer-batch-size", "4", "--micro-batch-size", "2", "--quiet"]


def _save(model, folder):
    model.hf.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A 3-layer x 4-head llama (2 KV heads, head_dim 16, hidden 64) as a local HF folder."""
    return _save(tiny_model("llama"), tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def other_folder(tmp_path_factory):
    return _save(tiny_model("llama", seed=7), tmp_path_factory.mktemp("tiny-llama-other"))


@pytest.fixture(scope="module")
def effects(tmp_path_factory):
    """Effects for the tiny model: heads 2.3, 2.2 most negative; MLP 1 most negative."""
    heads = [[-(4 * layer + head) / 100 for head in range(4)] for layer in range(3)]
    path = tmp_path_factory.mktemp("effects") / "effects.json"
    path.write_text(json.dumps({"metric": "relative-logit", "method": "path", "model": "tiny-llama", "n_samples": 4,
                                "n_excluded": 0, "data_sha256": "x", "heads": heads, "mlps": [0.0, -0.3, 0.1],
                                "heads_sem": [[0.0] * 4] * 3, "mlps_sem": [0.0] * 3}))
    return path


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    rows = [{"prompt": f"{a} + {b} = ", "completion": str(a + b)} for a, b in [(1, 2), (3, 4), (5, 1), (2, 7),
                                                                              (12, 30), (8, 8), (40, 2), (9, 0)]]
    return _jsonl(tmp_path_factory.mktemp("data") / "train.jsonl", rows)


def finetune_argv(model, train, out, *extra):
    return ["finetune", "--model", str(model), "--device", "cpu", "--train", str(train), "--out", str(out),
            *STEPS, *extra]


def info(out):
    return json.loads((out / "finetune.json").read_text())


def error_line(err, command="finetune"):
    """The one error line `keyheads` printed (model loading may print progress before it)."""
    lines = [line for line in err.splitlines() if line.startswith(f"keyheads {command}: error: ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def adapter_run(tiny_folder, train_file, effects, tmp_path_factory):
    """A precise run of the top-2 heads and the top MLP, for merge, export and eval."""
    out = tmp_path_factory.mktemp("runs") / "precise"
    assert main(finetune_argv(tiny_folder, train_file, out, "--effects", str(effects), "--top-k", "2",
                              "--mlps", "1")) == 0
    return out


# ---- the methods -------------------------------------------------------------------------------

HIDDEN, HEAD_DIM, FFN = 64, 16, 128
SLICE = HEAD_DIM * HIDDEN  # one head's rows of W_Q (or a KV head's of W_K), or its columns of W_O


@pytest.mark.parametrize("extra, method, heads, mlps, kv, tuned, written", [
    # top-2 heads 2.3, 2.2 share KV head 1 of layer 2: Q rows + O columns each, K and V rows once; MLP 1 whole
    (["--effects", "EFFECTS", "--top-k", "2", "--mlps", "1"], "precise", ["2.3", "2.2"], [1], "group",
     2 * 2 * SLICE + 2 * SLICE + 3 * HIDDEN * FFN, "adapter.safetensors"),
    (["--heads", "1.0,2.3", "--kv", "none"], "precise", ["1.0", "2.3"], [], "none", 2 * 2 * SLICE,
     "adapter.safetensors"),
    (["--method", "full"], "full", None, None, None, "all", "model/model.safetensors"),
    # LoRA rank 2 on q, k, v, o of 3 layers: r * (in + out) each
    (["--method", "lora", "--lora-rank", "2"], "lora", None, None, None,
     3 * 2 * ((HIDDEN + HIDDEN) * 2 + (HIDDEN + HIDDEN // 2) * 2), "lora/adapter_model.safetensors"),
], ids=["precise-effects", "precise-heads-kv-none", "full", "lora"])
def test_finetune_methods(tiny_folder, train_file, effects, tmp_path, capsys, extra, method, heads, mlps, kv,
                          tuned, written):
    out = tmp_path / "run"
    extra = [str(effects) if x == "EFFECTS" else x for x in extra]
    assert main(finetune_argv(tiny_folder, train_file, out, *extra)) == 0
    record = info(out)
    assert record["method"] == method and record["kv"] == kv
    assert record["base_model"] == str(tiny_folder)
    if heads is None:
        assert record["components"] is None
    else:
        assert [f"{h['layer']}.{h['head']}" for h in record["components"]["heads"]] == heads
        assert record["components"]["mlps"] == mlps
    assert record["tuned_params"] == (record["total_params"] if tuned == "all" else tuned)
    assert record["train"]["steps"] == 2 and len(record["train"]["losses"]) == 2
    assert record["data"]["n"] == 8 and record["config"]["optimizer_batch_size"] == 4
    assert (out / written).is_file()
    printed = capsys.readouterr().out
    assert f"{record['tuned_params']:,} tuned parameters of {record['total_params']:,}" in printed
    assert f"wrote {out}/" in printed
    if method == "precise":
        assert f"training {len(heads)} heads {', '.join(heads)}" in printed
    if method == "lora":
        assert record["config"]["lora_rank"] == 2


def test_random_heads_follow_the_seed(tiny_folder, train_file, tmp_path):
    from keyheads.components import Components

    def heads(seed, name):
        out = tmp_path / name
        assert main(finetune_argv(tiny_folder, train_file, out, "--random-heads", "3", "--seed", seed,
                                  "--max-steps", "1")) == 0
        record = info(out)
        assert record["components"]["source"] == f"random 3 heads, seed {seed}"
        return record["components"]["heads"]

    first = heads("1", "a")
    assert len(first) == 3
    assert heads("1", "b") == first
    assert heads("2", "c") != first
    assert first == [h.to_json() for h in Components.random_heads(3, 3, 4, seed=1).heads]


def test_finished_run_is_not_redone(adapter_run, tiny_folder, train_file, effects, capsys):
    before = (adapter_run / "adapter.safetensors").stat().st_mtime_ns
    assert main(finetune_argv(tiny_folder, train_file, adapter_run, "--effects", str(effects), "--top-k", "2",
                              "--mlps", "1")) == 0
    assert (adapter_run / "adapter.safetensors").stat().st_mtime_ns == before


# ---- merge, export, eval -----------------------------------------------------------------------

def test_merge_and_peft_export(adapter_run, tmp_path, capsys):
    merged = tmp_path / "merged"
    assert main(["merge", "--adapter", str(adapter_run), "--out", str(merged)]) == 0
    assert (merged / "config.json").is_file() and (merged / "model.safetensors").is_file()
    assert (merged / "tokenizer.json").is_file()
    assert str(merged) in capsys.readouterr().out
    peft = tmp_path / "peft"
    assert main(["merge", "--adapter", str(adapter_run), "--out", str(peft), "--export", "peft"]) == 0
    config = json.loads((peft / "adapter_config.json").read_text())
    assert (peft / "adapter_model.safetensors").is_file()
    assert config["modules_to_save"] == ["model.layers.1.mlp"]  # the trained MLP travels whole
    assert "PeftModel.from_pretrained" in capsys.readouterr().out
    assert not list(merged.glob("adapter*"))  # the merged folder is a plain model, no adapter beside it


def test_eval_with_adapter_row(adapter_run, tiny_folder, shared_data, tmp_path, capsys):
    out = tmp_path / "eval"
    assert main(["eval", "--adapter", str(adapter_run), "--device", "cpu", "--benchmarks", "addsub", "--limit", "2",
                 "--few-shot", "0", "--max-new-tokens", "4", "--batch-size", "2", "--data-dir", str(shared_data),
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--quiet"]) == 0
    rows = (out / "table.md").read_text().split("\n")
    assert rows[2].startswith(f"| {tiny_folder} | - | - |")  # the adapter's base model is the reference row
    cells = [c.strip() for c in rows[3].strip("|").split("|")]
    assert cells[0] == f"{tiny_folder} + precise SFT"
    assert cells[1].endswith("sam./s") and cells[2] not in ("", "-")
    assert rows[3] in capsys.readouterr().out


# ---- input errors ------------------------------------------------------------------------------

@pytest.fixture
def spies(monkeypatch):
    """Counts model loads and training runs of `keyheads finetune`."""
    import keyheads.commands.finetune as command
    import keyheads.finetune as ft

    calls = {"load": 0, "train": 0}
    load, train = command.models.loading.load_model, ft.finetune

    def counted_load(*a, **k):
        calls["load"] += 1
        return load(*a, **k)

    def counted_train(*a, **k):
        calls["train"] += 1
        return train(*a, **k)

    monkeypatch.setattr(command.models.loading, "load_model", counted_load)
    monkeypatch.setattr(ft, "finetune", counted_train)
    return calls


# (flags, training rows or None for train_file, words the error names, whether the model may load for the check)
BAD = {
    "head-out-of-range": (["--heads", "9.0"], None, ["head 9.0 does not exist", "3 layers"], True),
    "mlp-out-of-range": (["--heads", "1.0", "--mlp-layers", "3"], None, ["MLP layer 3 does not exist", "0..2"], True),
    "effects-top-k-too-many": (["--effects", "EFFECTS", "--top-k", "13"], None, ["only 12", "top 13"], True),
    "empty-jsonl": (["--heads", "1.0"], [], ["no training examples"], False),
    "no-completion": (["--heads", "1.0"], [{"prompt": "1 + 1 = ", "completion": "2"}, {"prompt": "2 + 2 = "}],
                      [":2:", "no completion"], False),
    "empty-completion": (["--heads", "1.0"], [{"prompt": "1 + 1 = ", "completion": ""}],
                         [":1:", "completion is empty"], False),
    "not-json": (["--heads", "1.0"], ['{"prompt": "1 + 1 = ", '], [":1:", "not valid JSON"], False),
    "lr-zero": (["--heads", "1.0", "--lr", "0"], None, ["--lr 0: must be > 0"], False),
    "lr-negative": (["--heads", "1.0", "--lr", "-1"], None, ["--lr -1: must be > 0"], False),
    "batch-size-zero": (["--heads", "1.0", "--optimizer-batch-size", "0"], None,
                        ["--optimizer-batch-size 0: must be an integer >= 1"], False),
    "micro-batch-size-zero": (["--heads", "1.0", "--micro-batch-size", "0"], None,
                              ["--micro-batch-size 0: must be an integer >= 1"], False),
    "unknown-method": (["--method", "x"], None, ["--method x: must be one of precise, full, lora"], False),
    "unknown-kv": (["--heads", "1.0", "--kv", "x"], None, ["--kv x: must be one of group, none"], False),
    "missing-train-file": (["--heads", "1.0", "--train", "TMP/nope.jsonl"], None,
                           ["nope.jsonl", "neither a JSONL file"], False),
    "unknown-arith-kind": (["--heads", "1.0", "--train", "arith:nope"], None,
                           ["unknown arithmetic kind 'nope'", "multidigit"], False),
    "arith-bad-n": (["--heads", "1.0", "--train", "arith:multidigit:x"], None, ["N must be an integer"], False),
    "top-k-without-effects": (["--top-k", "2"], None, ["--effects"], False),
    "mlps-without-effects": (["--heads", "1.0", "--mlps", "1"], None, ["--effects"], False),
    "heads-and-random-heads": (["--heads", "1.0", "--random-heads", "2"], None, ["choose heads one way"], False),
    "nothing-to-train": ([], None, ["precise SFT needs heads or MLPs"], False),
    "malformed-head": (["--heads", "1.0,x"], None, ["head 'x'", "LAYER.HEAD"], False),
    "missing-effects-file": (["--effects", "TMP/none.json", "--top-k", "2"], None, ["none.json", "keyheads identify"],
                             False),
    "heads-with-full": (["--method", "full", "--heads", "1.0"], None, ["--heads", "--method precise"], False),
    "random-heads-zero": (["--random-heads", "0"], None, ["--random-heads 0: must be an integer >= 1"], False),
    "max-steps-zero": (["--heads", "1.0", "--max-steps", "0"], None, ["--max-steps 0: must be an integer >= 1"], False),
    "unknown-parallel": (["--heads", "1.0", "--parallel", "zero3"], None, ["--parallel zero3", "ddp, fsdp"], False),
    "offload-without-fsdp": (["--heads", "1.0", "--offload"], None, ["--offload", "--parallel fsdp"], False),
    "offload-on-cpu": (["--heads", "1.0", "--parallel", "fsdp", "--offload", "--device", "cpu"], None,
                       ["--offload", "needs a GPU"], False),
    "device-auto-with-fsdp": (["--heads", "1.0", "--parallel", "fsdp", "--device", "auto"], None,
                              ["--device auto", "--parallel fsdp"], False),
}


# raised by code that still raises a plain ValueError, not a UserError: the CLI shows its traceback
@pytest.mark.parametrize("name", list(BAD))
def test_finetune_input_errors(name, tiny_folder, train_file, effects, tmp_path, capsys, spies):
    flags, rows, words, may_load = BAD[name]
    train = train_file if rows is None else _jsonl(tmp_path / "bad.jsonl", rows)
    flags = [str(effects) if f == "EFFECTS" else f.replace("TMP", str(tmp_path)) for f in flags]
    out = tmp_path / "run"
    assert main(finetune_argv(tiny_folder, train, out, *flags)) == 2
    err = error_line(capsys.readouterr().err)
    for word in words:
        assert word in err, (word, err)
    assert spies["train"] == 0 and not out.exists()
    if not may_load:
        assert spies["load"] == 0, "the check could have come before the model loads"


def test_a_batch_that_does_not_split_over_the_processes_is_refused(tiny_folder, train_file, tmp_path, capsys, spies,
                                                                  monkeypatch):
    import keyheads.distributed

    monkeypatch.setattr(keyheads.distributed, "world", lambda: 3)  # as under a launcher of three processes
    argv = finetune_argv(tiny_folder, train_file, tmp_path / "run", "--heads", "1.0", "--optimizer-batch-size", "8")
    assert main(argv) == 2
    err = error_line(capsys.readouterr().err)
    assert "--optimizer-batch-size 8: does not split over the 3 processes; use a multiple of 3" in err
    assert spies["load"] == 0 and spies["train"] == 0


def test_accelerates_own_fsdp_is_refused(tiny_folder, train_file, tmp_path, capsys, spies, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch --use_fsdp` sets
    assert main(finetune_argv(tiny_folder, train_file, tmp_path / "run", "--heads", "1.0")) == 2
    err = error_line(capsys.readouterr().err)
    assert "--use_fsdp" in err and "--parallel fsdp" in err
    assert spies["load"] == 0 and spies["train"] == 0


def test_batch_size_is_not_the_optimizer_batch(tiny_folder, train_file, tmp_path, capsys, spies):
    """`--batch-size` is the forward batch everywhere else, so finetune does not take it silently."""
    with pytest.raises(SystemExit) as done:
        main(finetune_argv(tiny_folder, train_file, tmp_path / "run", "--heads", "1.0", "--batch-size", "16"))
    assert done.value.code == 2 and "unrecognized arguments: --batch-size 16" in capsys.readouterr().err
    assert spies["load"] == 0


def test_merge_or_eval_of_a_truncated_adapter_is_one_line(adapter_run, tmp_path, capsys, spies):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(adapter_run, broken)
    data = (broken / "adapter.safetensors").read_bytes()
    (broken / "adapter.safetensors").write_bytes(data[:len(data) // 2])  # an interrupted copy
    assert main(["merge", "--adapter", str(broken), "--out", str(tmp_path / "m")]) == 2
    err = error_line(capsys.readouterr().err, "merge")
    assert f"{broken}/adapter.safetensors cannot be read" in err and "truncated" in err
    assert main(["eval", "--adapter", str(broken), "--out", str(tmp_path / "e")]) == 2
    err = error_line(capsys.readouterr().err, "eval")
    assert f"{broken}/adapter.safetensors cannot be read" in err
    assert spies["load"] == 0 and not (tmp_path / "m").exists()


def test_resume_with_other_settings_is_refused(tiny_folder, train_file, tmp_path, capsys):
    out = tmp_path / "run"
    # the checkpoint after step 1 of 2 is removed once the run has finished
    assert main(finetune_argv(tiny_folder, train_file, out, "--heads", "1.0", "--save-every", "1")) == 0
    assert (out / "finetune.json").is_file() and not (out / "checkpoint").exists()
    finished = (out / "finetune.json").read_text()
    capsys.readouterr()
    assert main(finetune_argv(tiny_folder, train_file, out, "--heads", "1.0", "--save-every", "1",
                              "--lr", "1e-4")) == 2
    err = capsys.readouterr().err
    assert "other settings" in err and "config.lr" in err and "2e-05" in err and "0.0001" in err
    assert (out / "finetune.json").read_text() == finished  # the finished run is untouched
    # save_every may change on resume: the same run with another one is finished already
    assert main(finetune_argv(tiny_folder, train_file, out, "--heads", "1.0", "--save-every", "5")) == 0
    assert (out / "finetune.json").read_text() == finished  # not trained again


def test_merge_errors(adapter_run, tiny_folder, other_folder, train_file, tmp_path, capsys):
    from keyheads.models import load_model
    from keyheads.models.fingerprint import base_fingerprint

    want = info(adapter_run)["base_fingerprint"]
    have = base_fingerprint(load_model(str(other_folder), device="cpu"))
    assert want != have
    for export in ("hf", "peft"):
        out = tmp_path / f"onto-other-{export}"
        assert main(["merge", "--adapter", str(adapter_run), "--model", str(other_folder), "--out", str(out),
                     "--export", export]) == 2
        err = error_line(capsys.readouterr().err, "merge")
        assert want in err and have in err and str(other_folder) in err
        assert not out.exists()
    # an existing --out is refused, not overwritten
    (tmp_path / "taken").mkdir()
    assert main(["merge", "--adapter", str(adapter_run), "--out", str(tmp_path / "taken")]) == 2
    assert "exists" in capsys.readouterr().err
    # a folder without a precise adapter (here a LoRA run) says what merge needs
    lora = tmp_path / "lora"
    assert main(finetune_argv(tiny_folder, train_file, lora, "--method", "lora", "--max-steps", "1")) == 0
    capsys.readouterr()
    assert main(["merge", "--adapter", str(lora), "--out", str(tmp_path / "m")]) == 2
    assert "--method precise" in capsys.readouterr().err


# ---- the bundled model -------------------------------------------------------------------------

@pytest.mark.real_model
def test_bundled_model_each_method(tmp_path, capsys):
    import torch

    threads = torch.get_num_threads()
    common = [
        "--model",
        "smollm2-135m",
        "--train",
        "arith:multidigit:8",
        "--max-steps",
        "1",
        "--optimizer-batch-size",
        "2",
        "--micro-batch-size",
        "2",
        "--quiet",
        "--threads",
        "2",
    ]
    runs = {"precise": ["--heads", "14.2,23.3"], "random": ["--random-heads", "4"], "full": ["--method", "full"],
            "lora": ["--method", "lora"]}
    try:
        for name, extra in runs.items():
            out = tmp_path / name
            assert main(["finetune", *common, "--out", str(out), *extra]) == 0, name
            record = info(out)
            assert record["base_model"] == "smollm2-135m" and record["train"]["steps"] == 1
            assert f"{record['tuned_params']:,} tuned parameters" in capsys.readouterr().out
    finally:
        torch.set_num_threads(threads)
    assert info(tmp_path / "precise")["components"]["heads"] == [{"layer": 14, "head": 2}, {"layer": 23, "head": 3}]
    assert len(info(tmp_path / "random")["components"]["heads"]) == 4
    assert info(tmp_path / "full")["tuned_params"] == info(tmp_path / "full")["total_params"]


def test_finished_run_with_other_settings_is_refused(tiny_folder, train_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(finetune_argv(tiny_folder, train_file, out, "--heads", "1.0")) == 0
    finished = (out / "finetune.json").read_text()
    assert main(finetune_argv(tiny_folder, train_file, out, "--heads", "1.0", "--lr", "1e-3")) == 2
    assert "lr" in error_line(capsys.readouterr().err)
    assert (out / "finetune.json").read_text() == finished


def test_sigterm_saves_finished_steps_like_ctrl_c(tiny_folder, train_file, tmp_path, capsys, monkeypatch):
    """A scheduler's SIGTERM mid-run keeps the finished step (no periodic checkpoint is due), exits 130, and
    the handler is put back afterwards."""
    import os
    import signal

    import keyheads.finetune.train as train_mod

    real, calls = train_mod.collate, [0]

    def terminated_collate(*args, **kwargs):  # 2 micro-batches a step: call 3 is step 2's first
        calls[0] += 1
        if calls[0] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(train_mod, "collate", terminated_collate)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "run"
    assert main(finetune_argv(tiny_folder, train_file, out, "--heads", "1.0", "--save-every", "0",
                              "--save-minutes", "0")) == 130
    assert "interrupted" in capsys.readouterr().err
    assert json.loads((out / "checkpoint" / "record.json").read_text())["step"] == 1
    assert signal.getsignal(signal.SIGTERM) == before
    monkeypatch.undo()
    assert main(finetune_argv(tiny_folder, train_file, out, "--heads", "1.0")) == 0
    assert info(out)["train"]["steps_this_run"] == 1

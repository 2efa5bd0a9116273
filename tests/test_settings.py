"""keyheads.machine: the up-front checks, and the common flags of every model-loading command."""
import argparse
import importlib.util
import os
import re

import pytest
import torch

from keyheads import machine
from keyheads.cli import COMMAND_MODULES, build_parser, main
from keyheads.machine import SettingError, check_device, check_dtype, check_writable_dir, check_writable_file

COMMON = ("--threads", "--device", "--dtype")
SEEDED = ("data", "knockout", "attention", "mlp", "eval", "finetune")  # where the seed picks something
SHOW_PROGRESS = SEEDED + ("identify", "faithfulness")  # where --quiet has bars to hide
# every command that loads a model; `demo` and `run` (keyheads.commands.run) have their own tests, and
# `plan` reads only a model's config (tests/test_plan.py)
LOADERS = ("data", "identify", "knockout", "attention", "mlp", "eval", "finetune", "merge", "generate", "faithfulness")
# plan and export read only a config; patch is identify's old name
OWNED_ELSEWHERE = ("demo", "run", "plan", "export", "patch")


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def gpus(monkeypatch):
    """Two CUDA GPUs of compute capability 7.5 (no native bfloat16)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Tesla T4")


# ---- devices and dtypes -------------------------------------------------------------------------
def test_cpu_and_none_are_always_fine():
    assert check_device(None) is None and check_device("cpu") == "cpu"


def test_cuda_on_a_machine_without_one(no_gpu):
    with pytest.raises(SettingError) as err:
        check_device("cuda", "--device")
    assert str(err.value) == ("--device cuda: this machine has no CUDA GPU (torch.cuda.is_available() is False); "
                              "use cpu")
    with pytest.raises(SettingError, match=r"^device: 'cuda:7' given; this machine has no CUDA GPU"):
        check_device("cuda:7")


def test_cuda_index_beyond_the_gpus(gpus):
    assert check_device("cuda") == "cuda" and check_device("cuda:1") == "cuda:1"
    with pytest.raises(SettingError, match=r"--device cuda:7: this machine has 2 CUDA GPUs \(cuda:0 to cuda:1\)"):
        check_device("cuda:7", "--device")


@pytest.mark.parametrize("value", ["tpu", "cuda:x", "cuda:", "CPU", "gpu", "", 0])
def test_unknown_devices(value):
    with pytest.raises(SettingError, match="unknown device; use cpu, cuda, cuda:N, mps or auto"):
        check_device(value, "--device")


def test_mps_and_auto_need_what_they_use(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(SettingError, match="--device mps: MPS"):
        check_device("mps", "--device")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(SettingError, match="--device auto: .*pip install accelerate"):
        check_device("auto", "--device")


@pytest.mark.parametrize("value, name", [("float32", "float32"), ("fp32", "float32"), ("bf16", "bfloat16"),
                                         ("fp16", "float16"), ("float64", "float64"), (None, None)])
def test_dtype_names(value, name):
    assert check_dtype(value, device="cpu") == name


def test_float16_on_cpu_is_allowed_as_load_model_supports_it():
    assert check_dtype("float16", device="cpu") == "float16"


@pytest.mark.parametrize("value", ["half", "float8", "int8", "Float32", "", 16])
def test_unknown_dtypes(value):
    with pytest.raises(SettingError, match=r"unknown dtype; use float32, bfloat16, float16 or float64"):
        check_dtype(value, "--dtype")


def test_bfloat16_needs_a_gpu_that_has_it(gpus, monkeypatch):
    with pytest.raises(SettingError, match=r"--dtype bf16: Tesla T4 \(compute capability 7.5\) has no bfloat16"):
        check_dtype("bf16", "--dtype", device="cuda:1")
    with pytest.raises(SettingError, match="no bfloat16"):
        check_dtype("bfloat16", device=None)  # load_model would pick the GPU
    assert check_dtype("bfloat16", device="cpu") == "bfloat16"
    assert check_dtype("float16", device="cuda") == "float16"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    assert check_dtype("bfloat16", device="cuda") == "bfloat16"


def test_load_model_takes_the_same_dtype_names():
    from keyheads.models import loading

    assert loading.check_dtype is machine.check_dtype
    assert all(hasattr(torch, name) for name in machine.DTYPES.values())


# ---- output folders and files -------------------------------------------------------------------
def test_writable_dir(tmp_path):
    assert check_writable_dir(tmp_path) == tmp_path
    new = tmp_path / "a" / "b"
    assert check_writable_dir(str(new)) == new and not (tmp_path / "a").exists()  # creates nothing


def test_dir_that_is_a_file_or_under_a_file(tmp_path):
    file = tmp_path / "f.txt"
    file.write_text("x")
    with pytest.raises(SettingError, match="^" + re.escape(f"--out {file}: is a file; give a folder")):
        check_writable_dir(file, "--out")
    with pytest.raises(SettingError, match=re.escape(f"--out {file}/run/x: cannot be created: {file} is a file")):
        check_writable_dir(file / "run" / "x", "--out")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits; the under-a-file case covers it")
def test_dir_in_a_read_only_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(SettingError, match="not writable"):
            check_writable_dir(locked / "run", "--out")
        with pytest.raises(SettingError, match="not writable"):
            check_writable_dir(locked, "--out")
    finally:
        locked.chmod(0o700)


def test_writable_file(tmp_path):
    assert check_writable_file(tmp_path / "new" / "pairs.jsonl") == tmp_path / "new" / "pairs.jsonl"
    with pytest.raises(SettingError, match="is a folder; give a file name"):
        check_writable_file(tmp_path, "--out")
    (tmp_path / "f").write_text("x")
    with pytest.raises(SettingError, match="cannot be created"):
        check_writable_file(tmp_path / "f" / "pairs.jsonl", "--out")


# ---- numbers and choices, as the settings models check them -----------------------------------------
@pytest.mark.parametrize("text, size", [("80GiB", 80 * 2**30), ("80 GB", 80 * 10**9), ("1.5mib", 3 * 2**19),
                                        ("500MB", 500 * 10**6), ("2KiB", 2048), ("2kb", 2000), ("4096", 4096),
                                        ("7b", 7), ("1TiB", 2**40)])
def test_one_reader_of_sizes(text, size):
    """--gpu-memory (plan) and --max-memory (dispatch) read sizes alike: binary GiB, decimal GB, plain bytes."""
    assert machine.parse_bytes(text, "gpu_memory") == size
    assert machine.parse_max_memory(f"cpu={text}") == {"cpu": size}


@pytest.mark.parametrize("text", ["lots", "80 gigs", "GiB", "0", "-1GB", "8 0GB"])
def test_what_is_not_a_size(text):
    with pytest.raises(SettingError, match=re.escape(f"--gpu-memory {text}: expected a positive size, e.g. 80GiB")):
        machine.parse_bytes(text, "--gpu-memory")


def test_integer_settings_refuse_bools_and_floats():
    from keyheads.config.run import RunSettings

    for value in (True, 2.5, "five"):
        with pytest.raises(SettingError, match=f"knockout.k: {re.escape(repr(value))} given; must be an integer"):
            RunSettings.make(eval={"benchmarks": []}, knockout={"k": value})
    assert RunSettings.make(eval={"benchmarks": []}, knockout={"k": 3.0}).knockout.k == 3


def test_setting_error_also_takes_a_plain_message():
    assert str(SettingError("seed and seeds disagree")) == "seed and seeds disagree"
    err = SettingError("top_k", -3, "must be an integer >= 1")
    assert str(err) == "top_k: -3 given; must be an integer >= 1" and (err.key, err.value) == ("top_k", -3)
    assert isinstance(err, ValueError)


# ---- the common flags ---------------------------------------------------------------------------
def _machine(**values):
    from keyheads.config.base import MachineSettings

    return MachineSettings.model_validate(values)


def test_common_settings_defaults_and_normalisation():
    m = _machine()
    assert (m.device, m.dtype, m.threads) == (None, None, None)
    m = _machine(device="cpu", dtype="bf16", threads=2)
    assert (m.device, m.dtype, m.threads) == ("cpu", "bfloat16", 2)


@pytest.mark.parametrize("argv, message", [
    (["--threads", "0"], "--threads 0: must be an integer >= 1"),
    (["--seed", "-1"], "--seed -1: must be an integer >= 0"),
    (["--device", "tpu"], "--device tpu: unknown device"),
    (["--dtype", "float8"], "--dtype float8: unknown dtype"),
])
def test_common_flags_are_named_as_typed(argv, message, tmp_path, capsys):
    (tmp_path / "pairs.jsonl").write_text('{"reference": "1 + 2 = ", "counterfactual": "1 @ 2 = ", "answer": "3"}\n')
    assert main(_argv("knockout", tmp_path, *argv)) == 2
    assert f"keyheads knockout: error: {message}" in capsys.readouterr().err


def test_threads_flag_sets_torch_threads(tmp_path, monkeypatch):
    import keyheads.commands.models as command

    def stop(*a, **k):
        raise KeyboardInterrupt  # the settings are applied; nothing loads

    monkeypatch.setattr(command, "load_from_args", stop)
    before = torch.get_num_threads()
    try:
        assert main(_argv("generate", tmp_path, "--threads", "1")) == 130
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_model_loading_command_is_covered():
    assert len(COMMAND_MODULES) >= 6
    loading = {name for name, p in _subparsers().items() if "--model" in p._option_string_actions}
    assert loading - set(OWNED_ELSEWHERE) == set(LOADERS)


@pytest.mark.parametrize("command", LOADERS)
def test_command_has_the_common_flags(command, tmp_path):
    p = _subparsers()[command]
    for flag in COMMON:
        assert flag in p._option_string_actions, (command, flag)
    # no flag that changes nothing
    assert ("--seed" in p._option_string_actions) == (command in SEEDED)
    assert ("--quiet" in p._option_string_actions) == (command in SHOW_PROGRESS)
    text = p.format_help()
    assert all(flag in text for flag in COMMON)
    args = p.parse_args(_MINIMAL[command] + ["--threads", "2", "--device", "cpu", "--dtype", "fp32"]
                        + ["--seed", "5"] * (command in SEEDED) + ["--quiet"] * (command in SHOW_PROGRESS))
    assert args.threads == "2" and getattr(args, "quiet", True) is True


def test_one_meaning_per_flag_name():
    """--batch-size is the forward batch everywhere; the optimizer batch has its own name."""
    commands = _subparsers()
    assert "--optimizer-batch-size" in commands["finetune"]._option_string_actions
    assert "--batch-size" not in commands["finetune"]._option_string_actions
    assert "--finetune.optimizer-batch-size" in commands["run"]._option_string_actions
    assert "template ids" in commands["data"]._option_string_actions["--templates"].help
    assert "template ids" in commands["run"]._option_string_actions["--data.templates"].help
    for name, p in commands.items():  # one subset convention: --limit (None: all), no --n-samples
        assert "--n-samples" not in p._option_string_actions, name


# the least each command needs to parse; paths under TMP
_MINIMAL = {
    "data": ["--out", "TMP/pairs.jsonl"],
    "identify": ["--data", "TMP/pairs.jsonl", "--out", "TMP/run"],
    "knockout": ["--data", "TMP/pairs.jsonl", "--out", "TMP/run"],
    "attention": ["--data", "TMP/pairs.jsonl", "--out", "TMP/run"],
    "mlp": ["--data", "TMP/pairs.jsonl", "--out", "TMP/run"],
    "eval": ["--out", "TMP/run"],
    "finetune": ["--train", "arith:multidigit:8", "--heads", "1.0", "--out", "TMP/run"],
    "merge": ["--adapter", "TMP/adapter", "--out", "TMP/merged"],
    "generate": ["3 + 4 ="],
    "faithfulness": ["--circuit", "TMP/effects.json", "--data", "TMP/pairs.jsonl", "--out", "TMP/run"],
}


@pytest.fixture
def no_model_loads(monkeypatch, no_gpu):
    """Any model load fails the test: every check below must come first."""
    import keyheads.models
    import keyheads.models.loading

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the settings were checked")

    monkeypatch.setattr(keyheads.models, "load_model", refuse)
    monkeypatch.setattr(keyheads.models.loading, "load_model", refuse)


def _argv(command, tmp_path, *extra):
    return [command] + [a.replace("TMP", str(tmp_path)) for a in _MINIMAL[command]] + list(extra)


def test_patch_on_cuda_without_a_gpu_fails_before_loading(tmp_path, capsys, no_model_loads):
    assert main(_argv("identify", tmp_path, "--device", "cuda")) == 2
    err = capsys.readouterr().err
    assert "keyheads identify: error: --device cuda: this machine has no CUDA GPU" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", LOADERS)
def test_bad_device_is_said_before_loading(command, tmp_path, capsys, no_model_loads):
    assert main(_argv(command, tmp_path, "--device", "tpu")) == 2
    assert f"keyheads {command}: error: --device tpu: unknown device" in capsys.readouterr().err


BAD_COUNTS = {
    "data": (["-n", "0"], "-n 0: must be an integer >= 1"),
    "identify": (["--batch-size", "0"], "--batch-size 0: must be an integer >= 1"),
    "knockout": (["-k", "0"], "-k 0: must be an integer >= 1"),
    "attention": (["--top-k", "-3"], "--top-k -3: must be an integer >= 1"),
    "mlp": (["--limit", "-1"], "--limit -1: must be an integer >= 1"),
    "eval": (["--limit", "0"], "--limit 0: must be an integer >= 1"),
    "finetune": (["--limit", "0"], "--limit 0: must be an integer >= 1"),
    "generate": (["--max-new-tokens", "0"], "--max-new-tokens 0: must be an integer >= 1"),
}


@pytest.mark.parametrize("command", list(BAD_COUNTS))
def test_bad_count_is_said_before_loading(command, tmp_path, capsys, no_model_loads):
    flags, message = BAD_COUNTS[command]
    (tmp_path / "pairs.jsonl").write_text('{"reference": "1 + 2 = ", "counterfactual": "1 @ 2 = ", "answer": "3"}\n')
    assert main(_argv(command, tmp_path, *flags)) == 2
    assert f"keyheads {command}: error: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["data", "identify", "knockout", "eval", "finetune"])
def test_out_that_cannot_be_written_is_said_before_loading(command, tmp_path, capsys, no_model_loads):
    (tmp_path / "pairs.jsonl").write_text('{"reference": "1 + 2 = ", "counterfactual": "1 @ 2 = ", "answer": "3"}\n')
    (tmp_path / "train.jsonl").write_text('{"prompt": "1 + 2 = ", "completion": "3"}\n')
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a folder should be")
    argv = _argv(command, tmp_path)
    argv[argv.index("--out") + 1] = str(blocker / "out")
    assert main(argv) == 2
    assert f"--out {blocker}/out: cannot be created: {blocker} is a file" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["identify", "knockout", "eval", "finetune"])
def test_out_where_nothing_can_be_written_is_said_before_loading(command, tmp_path, capsys, no_model_loads):
    """Permission bits do not stop root; /proc refuses every new file: the check tries to write."""
    (tmp_path / "pairs.jsonl").write_text('{"reference": "1 + 2 = ", "counterfactual": "1 @ 2 = ", "answer": "3"}\n')
    argv = _argv(command, tmp_path)
    argv[argv.index("--out") + 1] = "/proc/keyheads-run"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--out /proc/keyheads-run: cannot be created: /proc is not writable" in err and "Traceback" not in err


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    """Only bad input is one line: any other exception reaches the caller with its traceback."""
    import keyheads.commands.models as command

    def bug(*a, **k):
        raise ValueError("an internal bug")

    monkeypatch.setattr(command, "load_from_args", bug)
    with pytest.raises(ValueError, match="an internal bug"):
        main(_argv("generate", tmp_path))


def test_settings_errors_name_the_flag_not_pydantic_internals(tmp_path, capsys, no_model_loads):
    assert main(_argv("finetune", tmp_path, "--train", "arith:multidigit,nope", "--optimizer-batch-size", "0")) == 2
    err = capsys.readouterr().err
    assert "--train arith:multidigit,nope: unknown arithmetic kind 'nope'; known: multidigit" in err
    assert "--optimizer-batch-size 0: must be an integer >= 1" in err
    assert "ArgsKwargs" not in err and "pydantic" not in err and "Traceback" not in err

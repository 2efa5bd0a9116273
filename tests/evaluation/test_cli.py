"""`keyheads eval` end to end: a tiny model folder with a knockout row, and the bundled model."""
import json
import subprocess
import sys
import textwrap

import pytest

from keyheads.cli import main
from keyheads.evaluation.cache import read_rows


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, tiny):
    folder = tmp_path_factory.mktemp("tiny-model")
    tiny.hf.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    return folder


def test_eval_with_knockout_prints_the_table(tiny_folder, tiny_data, pairs_file, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["eval", "--model", str(tiny_folder), "--device", "cpu", "--knockout", "0.1,2.3", "--knockout-mlps", "1",
            "--knockout-data", str(pairs_file), "--benchmarks", "addsub,mmlu", "--limit", "3", "--few-shot", "1",
            "--max-new-tokens", "5", "--data-dir", str(tiny_data), "--cache-dir", str(tmp_path / "cache"),
            "--out", str(out), "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    table = (out / "table.md").read_text()
    assert table in printed
    header, _, base, ko = table.split("\n")[:4]
    assert header == "| Model | Train speed | Tuned params | AddSub Acc. | AddSub Δ | MMLU Acc. | MMLU Δ |"
    assert base.startswith(f"| {tiny_folder} | - | - |")
    assert "knockout (2 heads, MLPs 1)" in ko
    results = json.loads((out / "results.json").read_text())
    assert [v["benchmarks"]["addsub"]["n"] for v in results["variants"]] == [3, 3]
    assert results["variants"][1]["info"]["knockout"]["heads"] == [{"layer": 0, "head": 1}, {"layer": 2, "head": 3}]
    # a re-run is served from the cache
    assert main(argv) == 0
    again = json.loads((out / "results.json").read_text())
    assert all(b["timing"]["computed"] == 0 for v in again["variants"] for b in v["benchmarks"].values())
    assert results["variants"][1]["info"]["knockout"]["mean"] == "aligned"
    # the global mean: its own row name, its own record, and no answer taken from the aligned row's cache entries
    other = tmp_path / "global"
    assert main(argv[:-3] + ["--mean", "global", "--out", str(other), "--quiet"]) == 0
    glob = json.loads((other / "results.json").read_text())
    assert "knockout (2 heads, MLPs 1, global mean)" in (other / "table.md").read_text().split("\n")[3]
    assert glob["variants"][1]["info"]["knockout"]["mean"] == "global"
    assert [b["timing"]["computed"] for b in glob["variants"][0]["benchmarks"].values()] == [0, 0]
    assert [b["timing"]["computed"] for b in glob["variants"][1]["benchmarks"].values()] == [3, 3]


def test_eval_input_errors(tiny_folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    base = ["eval", "--model", str(tiny_folder), "--out", str(tmp_path / "run"), "--quiet"]
    assert main(base + ["--benchmarks", "gsm8k,nope"]) == 2
    assert "unknown benchmark 'nope'; known: gsm8k, addsub, singleeq, svamp, mmlu, csqa" in capsys.readouterr().err
    assert main(base + ["--knockout", "0.1"]) == 2
    assert "--knockout-data" in capsys.readouterr().err
    assert main(base + ["--variant", '{"model": "x"}']) == 2
    assert "--variant needs JSON like" in capsys.readouterr().err


def test_missing_benchmark_file_is_named(tiny_folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    base = ["eval", "--model", str(tiny_folder), "--out", str(tmp_path / "run"), "--quiet"]
    assert main(base + ["--benchmarks", "svamp", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "svamp" / "SVAMP.json") in err and "ChilleD/SVAMP" in err


def test_eval_adapter_that_is_broken_is_said_before_loading(tmp_path, capsys, monkeypatch):
    """A truncated adapter.safetensors, or a finetune.json without its keys: one line, no model loads."""
    import keyheads.models

    monkeypatch.setattr(keyheads.models.loading, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    folder = tmp_path / "ft"
    folder.mkdir()
    (folder / "finetune.json").write_text('{"method": "precise"}')
    assert main(["eval", "--adapter", str(folder), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"{folder}/finetune.json lacks base_model, base_fingerprint" in err and "re-run `keyheads finetune`" in err
    assert "Traceback" not in err
    (folder / "finetune.json").write_text(json.dumps({"base_model": "tiny", "base_fingerprint": "x",
                                                      "method": "precise", "tuned_params": 1, "train": {}}))
    (folder / "adapter.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": ")  # cut short
    assert main(["eval", "--adapter", str(folder), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"{folder}/adapter.safetensors cannot be read" in err and "truncated" in err and "Traceback" not in err


def test_lm_eval_stays_optional():
    """In a fresh interpreter where lm_eval cannot be imported (whether or not it is installed here):
    keyheads.evaluation never imports it, and the adapter says how to install it."""
    script = textwrap.dedent("""
        import sys

        class NoLmEval:
            def find_spec(self, name, path=None, target=None):
                if name == "lm_eval" or name.startswith("lm_eval."):
                    raise ImportError("No module named 'lm_eval'")

        sys.meta_path.insert(0, NoLmEval())
        import keyheads.evaluation
        assert "lm_eval" not in sys.modules
        from keyheads.errors import MissingPackage
        try:
            import keyheads.evaluation.lm_eval_adapter
        except MissingPackage as err:
            assert "pip install lm_eval" in str(err), err
        else:
            raise AssertionError("the adapter imported without lm_eval")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.real_model
def test_bundled_model_few_items(shared_data, tmp_path, capsys):
    import torch

    out = tmp_path / "run"
    threads = torch.get_num_threads()
    try:  # zero-shot and a short budget keep this quick; the full prompts run in the benchmark
        assert main(["eval", "--model", "smollm2-135m", "--device", "cpu", "--benchmarks", "svamp,csqa", "--limit", "2",
                     "--few-shot", "0", "--max-new-tokens", "24", "--threads", "1", "--data-dir", str(shared_data),
                     "--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--quiet"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert "| smollm2-135m | - | - |" in capsys.readouterr().out
    for name in ("svamp", "csqa"):
        summary = json.loads((out / "smollm2-135m" / f"{name}.json").read_text())
        assert summary["n"] == 2 and summary["timing"]["computed"] == 2
    cache = read_rows(tmp_path / "cache" / "svamp.sqlite")
    assert all(row["finish"] in ("stop", "eos", "length") for row in cache)

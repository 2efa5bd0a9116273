"""The converted-model cache under a launcher: two processes that start on an empty cache convert it once and
both get a whole folder (config and weights), which a later load reads; a folder that lacks them never
validates, whatever its manifest says."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed

from keyheads.models import loading
from keyheads.models.loading import MANIFEST, _cache_valid, load_model
from keyheads.testing import tiny_model

WORKER = Path(__file__).with_name("cache_worker.py")


@pytest.mark.distributed
@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason="torch.distributed with gloo is not available")
def test_two_processes_on_an_empty_cache_convert_once(tmp_path):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"not read: the worker replaces the GGUF reader")
    env = {**os.environ, "KEYHEADS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(WORKER),
           str(gguf), str(tmp_path / "results")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"workers failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    facts = [json.loads((tmp_path / "results" / f"rank{r}.json").read_text()) for r in range(2)]
    assert sum(f["reads"] for f in facts) == 1  # converted once, by whichever rank took the lock first
    assert facts[0]["folder"] == facts[1]["folder"] and all(f["valid"] for f in facts)
    assert {"config.json", "model.safetensors", MANIFEST} <= set(facts[0]["files"])
    folder = Path(facts[0]["folder"])
    loaded = load_model(str(folder), device="cpu")
    want = tiny_model("llama", seed=0)
    ids = want.encode(["12+34="])
    torch.testing.assert_close(loaded.forward(ids), want.forward(ids), atol=0, rtol=0)


def test_a_manifest_over_a_folder_without_weights_does_not_validate(tmp_path, monkeypatch):
    """What the multi-process conversion used to leave: tokenizer files under a manifest that lists only them.
    It must not validate, so the next load converts again instead of failing on it forever."""
    monkeypatch.setenv("KEYHEADS_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"x")
    folder = loading.cached_folder(str(gguf))
    folder.mkdir(parents=True)
    model = tiny_model("llama", seed=0)
    model.tokenizer.save_pretrained(folder)
    files = {p.name: {"size": p.stat().st_size, "sha256": loading.file_sha256(p)} for p in folder.iterdir()}
    (folder / MANIFEST).write_text(json.dumps({"source": str(gguf), "files": files}))
    assert not _cache_valid(folder)
    monkeypatch.setattr(loading, "_read_gguf", lambda path, tied=False, whole=False: (model.hf, model.tokenizer))
    assert loading.ensure_converted(str(gguf), progress=False) == folder
    assert _cache_valid(folder) and (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def test_a_verified_folder_is_hashed_again_only_when_a_file_changes(tmp_path, monkeypatch):
    """The sums are checked once; later loads compare the files' stat results with the stamp that check left.
    A rewrite of a file, even to the same size and the same bytes, brings the full check back."""
    monkeypatch.setenv("KEYHEADS_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"x")
    model = tiny_model("llama", seed=0)
    monkeypatch.setattr(loading, "_read_gguf", lambda path, tied=False, whole=False: (model.hf, model.tokenizer))
    folder = loading.ensure_converted(str(gguf), progress=False)
    hashed = []
    real_sha256 = loading.file_sha256
    monkeypatch.setattr(loading, "file_sha256", lambda path: hashed.append(path.name) or real_sha256(path))
    (folder / loading.VERIFIED).unlink()
    assert _cache_valid(folder) and "model.safetensors" in hashed
    hashed.clear()
    assert _cache_valid(folder) and _cache_valid(folder) and hashed == []
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # same size, same bytes: a new ctime
    assert _cache_valid(folder) and "model.safetensors" in hashed
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert not _cache_valid(folder)


def test_a_bundled_name_is_read_shard_by_shard_like_a_folder(tmp_path, monkeypatch):
    """Under FSDP2 a bundled name takes the path of its converted folder: the skeleton, no weights read whole."""
    from keyheads.models.bundled import BUNDLED
    from keyheads.models.loading import cached_folder, load_placed

    monkeypatch.setenv("KEYHEADS_CACHE", str(tmp_path))
    monkeypatch.setitem(BUNDLED, "tiny-bundled", BUNDLED["smollm2-135m"])  # its parts are not read: the cache is there
    model = tiny_model("llama", seed=0)
    loading._save_converted(model.hf, model.tokenizer, tmp_path / "tiny.gguf", cached_folder("tiny-bundled"))
    loaded, where = load_placed("tiny-bundled", "cpu", sharded=True)
    assert where.run_on == "cpu" and all(p.device.type == "meta" for p in loaded.hf.parameters())

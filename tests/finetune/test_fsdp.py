"""FSDP2 on two CPU processes (gloo, torchrun) trains what one plain process trains, for every method,
on a family with grouped K/V heads (llama) and one without (gpt_neox, fused QKV), from a model folder whose
weights each process reads only its own shards of, and from a model given whole in memory; each process
holds about half the frozen weights; a run killed mid-way resumes, on two processes or on one, to the
uninterrupted result; what it writes loads with plain transformers / PEFT."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from keyheads.components import Components
from keyheads.finetune.adapter import ADAPTER
from keyheads.finetune.run import finetune
from keyheads.finetune.settings import FinetuneSettings
from keyheads.testing import tiny_model

WORKER = Path(__file__).with_name("fsdp_worker.py")
HEADS = Components(((1, 0), (1, 1), (2, 3)), (2,), "test")  # heads and an MLP: precise + MLPs
RANDOM = Components.random_heads(3, 3, 4, seed=1)  # heads only
# Several steps with accumulation (8 samples over 2 processes in micro-batches of 2), clipping and the rescale.
BASE = dict(max_steps=3, save_every=2, optimizer_batch_size=8, micro_batch_size=2, lr=1e-2, max_grad_norm=0.5)
# AdamW moves every element by about lr whatever its gradient's size, so an element whose exact gradient
# is 0 follows the sign of float noise: GPT-NeoX's key bias (softmax ignores a constant added to every
# score) and LoRA's factors in their first steps. No split of the batch (DDP's neither) reproduces that
# noise, so those runs use SGD, which moves by the gradient itself; the others use AdamW, whose sharded
# state FSDP2 must then carry correctly.
SGD = dict(optimizer="sgd", lr=0.5, warmup_ratio=0.0)
RUNS = {"precise+mlp": ("precise", HEADS), "random": ("precise", RANDOM), "lora": ("lora", None),
           "full": ("full", None)}
# Families without dropout: a dropout mask depends on how the batch is split, so no split could match.
FAMILIES = ("llama", "gpt_neox")
KILLED = dict(BASE, max_steps=4)

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                                 reason="torch.distributed with gloo is not available")]


def config(family: str = "llama", **kw) -> FinetuneSettings:
    noisy = family == "gpt_neox" or kw.get("method") == "lora"
    return FinetuneSettings(**{**kw, **(SGD if noisy else {})})


def launch(spec: dict, root: Path, name: str, processes: int = 2) -> subprocess.CompletedProcess:
    path = root / f"{name}.json"
    path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
           "--nproc_per_node", str(processes)] if processes > 1 else [sys.executable]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(cmd + [str(WORKER), str(path), str(root / "results")], env=env, capture_output=True,
                          text=True, timeout=240)


def run_spec(name, family, method, components, cfg: FinetuneSettings, out: Path, crash_at=None,
             folder: Path | None = None) -> dict:
    return {"name": name, "family": family, "components": components.to_json() if components else None,
            "config": cfg.to_json(), "out": str(out), "crash_at": crash_at, "folder": str(folder) if folder else None}


def saved(family: str, root: Path, tied: bool = False) -> Path:
    """The tiny model of `family` as a model folder (safetensors), as a user's model comes; `tied`: with its
    unembedding tied to the embedding (the files then hold the embedding alone)."""
    folder = root / "models" / (family + ("-tied" if tied else ""))
    if not folder.is_dir():
        model = tiny_model(family, seed=0)
        if tied:
            model.hf.config.tie_word_embeddings = True
            model.hf.tie_weights()
        model.hf.save_pretrained(folder)
        model.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def fsdp(examples, tmp_path_factory):
    """Every method on both families, and a killed run resumed on two processes and on one."""
    root = tmp_path_factory.mktemp("fsdp")
    exs = [{"prompt": e.prompt, "completion": e.completion} for e in examples]
    # every method on both families from a model folder: each process reads only its own shards (models.sharded)
    runs = [run_spec(f"{family}-{name}", family, method, comp, config(family, method=method, parallel="fsdp", **BASE),
                     root / "out" / f"{family}-{name}", folder=saved(family, root))
            for family in FAMILIES for name, (method, comp) in RUNS.items()]
    # a tied unembedding (SmolLM2, Qwen, Gemma): the files hold only the embedding
    runs.append(run_spec("tied", "llama", "full", None, config(method="full", parallel="fsdp", **BASE),
                         root / "out" / "tied", folder=saved("llama", root, tied=True)))
    # and a model given whole, in memory (the Python API)
    runs.append(run_spec("in-memory", "llama", "precise", HEADS, config(method="precise", parallel="fsdp", **BASE),
                         root / "out" / "in-memory"))
    killed = config(method="precise", parallel="fsdp", **KILLED)
    llama = saved("llama", root)
    runs.append(run_spec("uninterrupted", "llama", "precise", HEADS, killed, root / "out" / "uninterrupted",
                         folder=llama))
    proc = launch({"examples": exs, "runs": runs}, root, "all")
    assert proc.returncode == 0, f"workers failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"

    kill = run_spec("killed", "llama", "precise", HEADS, killed, root / "out" / "killed", crash_at=3, folder=llama)
    proc = launch({"examples": exs, "runs": [kill]}, root, "kill")
    assert proc.returncode != 0 and "simulated kill at step 3" in proc.stderr + proc.stdout
    shutil.copytree(root / "out" / "killed", root / "out" / "killed-on-one")
    shutil.copytree(root / "out" / "killed" / "checkpoint", root / "killed-checkpoint")  # gone once resumed runs end
    resumed = []
    for name, processes in (("killed", 2), ("killed-on-one", 1)):
        spec = run_spec(name, "llama", "precise", HEADS, killed, root / "out" / name, folder=llama)
        proc = launch({"examples": exs, "runs": [spec]}, root, f"resume-{name}", processes)
        assert proc.returncode == 0, f"resume failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        resumed.append(proc.stdout + proc.stderr)
    return root, resumed


def facts(root: Path, name: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((root / "results" / name).glob("rank*.json"))]


def reference(examples, family: str, method: str, components, cfg: FinetuneSettings, out: Path):
    """One plain process (no process group, no sharding)."""
    model = tiny_model(family, seed=0)
    info = finetune(model, examples, cfg, out, components, progress=False)
    return model, info


def trained(model) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in model.hf.named_parameters()}


def worst(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", list(RUNS))
def test_two_fsdp_processes_train_what_one_plain_process_trains(fsdp, examples, tmp_path, family, name):
    root, _ = fsdp
    method, components = RUNS[name]
    ranks = facts(root, f"{family}-{name}")
    assert [f["rank"] for f in ranks] == [0, 1] and {f["world"] for f in ranks} == {2}
    assert {f["backend"] for f in ranks} == {"gloo"} and {f["parallel"] for f in ranks} == {"fsdp"}
    assert all(f["sharded"] for f in ranks)  # every parameter became a DTensor shard
    model, info = reference(examples, family, method, components, config(family, method=method, **BASE),
                             tmp_path / "one")
    for f in ranks:
        assert f["losses"] == pytest.approx(info.train.losses, abs=1e-5)
    out = root / "out" / f"{family}-{name}"
    if method == "precise":
        written, single = load_file(str(out / ADAPTER)), load_file(str(tmp_path / "one" / ADAPTER))
        assert max(v.abs().max().item() for k, v in written.items() if k.endswith(".weight")) > 1e-3  # it trained
        assert worst(written, single) < 1e-5
    elif method == "lora":
        from peft import PeftModel

        base = tiny_model(family, seed=0)
        loaded = PeftModel.from_pretrained(base.hf, str(out / "lora"))
        assert worst({n.removeprefix("base_model.model."): p for n, p in loaded.named_parameters() if "lora_" in n},
                     {n: p for n, p in trained(model).items() if "lora_" in n}) < 1e-5
    else:
        loaded = AutoModelForCausalLM.from_pretrained(out / "model")
        assert worst(dict(loaded.named_parameters()), trained(model)) < 1e-5
        assert worst(dict(loaded.named_parameters()), trained(tiny_model(family, seed=0))) > 1e-3


def test_a_model_given_whole_trains_as_one_read_shard_by_shard(fsdp):
    root, _ = fsdp
    whole, read = facts(root, "in-memory"), facts(root, "llama-precise+mlp")
    for a, b in zip(whole, read, strict=True):
        assert a["losses"] == pytest.approx(b["losses"], abs=1e-6)
    assert worst(load_file(str(root / "out" / "in-memory" / ADAPTER)),
                 load_file(str(root / "out" / "llama-precise+mlp" / ADAPTER))) < 1e-6


def test_a_tied_model_read_shard_by_shard_trains_as_loaded_whole(fsdp, examples, tmp_path):
    root, _ = fsdp
    from keyheads import models

    model, _ = models.load_placed(str(saved("llama", root, tied=True)), "cpu", "float32")
    assert model.hf.get_output_embeddings().weight is model.hf.get_input_embeddings().weight
    info = finetune(model, examples, config(method="full", **BASE), tmp_path / "one", progress=False)
    for f in facts(root, "tied"):
        assert f["losses"] == pytest.approx(info.train.losses, abs=1e-5)
    loaded = AutoModelForCausalLM.from_pretrained(root / "out" / "tied" / "model")
    assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
    # the same files as one process writes: the unembedding is not saved a second time
    assert set(load_file(str(root / "out" / "tied" / "model" / "model.safetensors"))) == \
        set(load_file(str(tmp_path / "one" / "model" / "model.safetensors")))
    assert worst(dict(loaded.named_parameters()), trained(model)) < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_each_process_holds_about_half_the_frozen_weights(fsdp, family):
    root, _ = fsdp
    ranks = facts(root, f"{family}-random")
    total = ranks[0]["frozen_bytes_all"]
    assert total > 0.9 * ranks[0]["model_bytes"]  # precise SFT of heads freezes nearly everything
    assert sum(f["frozen_bytes_here"] for f in ranks) == total
    for f in ranks:
        assert 0.4 < f["frozen_bytes_here"] / total < 0.6


def test_a_killed_run_resumes_to_the_uninterrupted_result(fsdp, examples, tmp_path):
    root, logs = fsdp
    assert all("resuming from" in log and "at step 2" in log for log in logs)
    _, info = reference(examples, "llama", "precise", HEADS, config(method="precise", **KILLED), tmp_path / "one")
    single = load_file(str(tmp_path / "one" / ADAPTER))
    for name in ("killed", "killed-on-one"):
        written = load_file(str(root / "out" / name / ADAPTER))
        assert worst(written, single) < 1e-5, name
        done = json.loads((root / "out" / name / "finetune.json").read_text())
        assert done["train"]["losses"] == pytest.approx(info.train.losses, abs=1e-5)
    # killed and resumed on the same two processes: bit for bit the uninterrupted run
    resumed, whole = load_file(str(root / "out" / "killed" / ADAPTER)), load_file(str(root / "out" / "uninterrupted" /
                                                                                       ADAPTER))
    assert set(resumed) == set(whole) and all(torch.equal(resumed[k], whole[k]) for k in whole)
    # the checkpoint of step 2 was sharded: one file per process; the finished runs keep none
    assert len(list((root / "killed-checkpoint" / "shards").glob("*.distcp"))) == 2
    assert not any((root / "out" / name / "checkpoint").exists() for name in ("killed", "killed-on-one"))


def test_a_truncated_weights_file_read_shard_by_shard_is_named(tmp_path):
    """The weights read after sharding come from the files: a file cut short is a one-line BadFile."""
    from keyheads.errors import BadFile
    from keyheads.models.sharded import materialize, read_own_shards, skeleton

    folder = saved("llama", tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    model = skeleton(folder, torch.float32)
    empty = materialize(model, torch.device("cpu"))
    with pytest.raises(BadFile, match="its weights cannot be read.*truncated"):
        read_own_shards(model, folder, empty)

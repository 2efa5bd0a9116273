"""A model dispatched by accelerate, with layers offloaded to disk, gives the numbers of the plain model.

Each tiny model is saved once and loaded twice from its folder: on the CPU, and with `device="auto"`
and a CPU limit below its size, so that accelerate's device map keeps the embedding and the first
layer in memory and sends the other layers, the final norm and the unembedding to an offload
folder. Their parameters then sit on the meta device, loaded by accelerate's hooks only during
their own module's forward: any code that reads a weight itself finds nothing there. Every
analysis must give the plain model's numbers within 1e-5.
"""
import json

import numpy as np
import pytest
import torch

from keyheads import models
from keyheads.analysis.attention import by_role, end_attention
from keyheads.analysis.common import all_heads, load_samples
from keyheads.analysis.knockout_curves import CurveSettings, knockout_curves
from keyheads.analysis.mlp import probe
from keyheads.analysis.passes import EndPasses
from keyheads.cli import main
from keyheads.config.run import RunSettings
from keyheads.errors import SettingError
from keyheads.evaluation import EvalSettings, Variant, evaluate
from keyheads.evaluation.cache import read_rows
from keyheads.knockout import compute_means
from keyheads.models import load_model
from keyheads.models.fingerprint import parameters_fingerprint
from keyheads.models.prompt_set import PromptSet
from keyheads.patching.activation import activation_patch_batch
from keyheads.patching.attribution import attribution_patch_batch
from keyheads.patching.path import path_patch_batch
from keyheads.patching.samples import Batch
from keyheads.testing import tiny_model
from keyheads.testing.oracles import Batches, predict

from tests.helpers import assert_json_close, make_rows, write_rows

TOL = dict(atol=1e-5, rtol=0)
REF = ["3 + 4 = ", "5 + 2 = ", "1 + 1 = "]
CF = ["3 @ 4 = ", "5 < 2 = ", "1 > 1 = "]
# llama: grouped key/value heads, separate unembedding; gpt2: one key/value head per query head,
# Conv1D projections with biases, unembedding tied to the embedding; gemma3: norms after attention
# and MLP, logit soft-capping, sliding-window layers
FAMILIES = ("llama", "gpt2", "gemma3")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models are far faster on one thread, most of all on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.hf.parameters())


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    """(plain model, dispatched model, model folder) of one family."""
    root = tmp_path_factory.mktemp(request.param)
    tiny = tiny_model(request.param, seed=3)
    tiny.hf.save_pretrained(root / "model")
    tiny.tokenizer.save_pretrained(root / "model")
    folder = str(root / "model")
    plain = load_model(folder, device="cpu", dtype="float32")
    limit = f"cpu={int(0.8 * _bytes(plain))}"  # room for the embedding and a layer or two, not for all
    dispatched = load_model(folder, device="auto", dtype="float32", max_memory=limit,
                            offload_folder=str(root / "offload"))
    return plain, dispatched, folder


def _offloaded_layers(model) -> list[int]:
    return [i for i, layer in enumerate(model.layers) if any(p.device.type == "meta" for p in layer.parameters())]


def test_layers_are_offloaded_and_resident_only_during_their_forward(pair):
    plain, dispatched, _ = pair
    offloaded = _offloaded_layers(dispatched)
    assert offloaded and "disk" in dispatched.hf.hf_device_map.values()
    assert dispatched.device == torch.device("cpu")  # the dispatch's main device, where inputs go
    # accelerate wraps the forward of every module that holds offloaded weights; inside the wrapper
    # (at the original forward, kept as _old_forward) the weights are loaded
    proj = dispatched.layer_module(offloaded[-1], dispatched.family.attn_out_proj)
    inner, seen = proj._old_forward, []

    def spy(*args, **kwargs):
        seen.append(proj.weight.device.type)
        return inner(*args, **kwargs)

    proj._old_forward = spy
    try:
        ids = plain.encode(REF).input_ids
        torch.testing.assert_close(dispatched.forward(ids), plain.forward(ids), **TOL)
    finally:
        proj._old_forward = inner
    assert seen == ["cpu"]  # loaded for its own forward ...
    assert proj.weight.device.type == "meta"  # ... and gone again after it
    assert dispatched.generate(REF[0], max_new_tokens=5) == plain.generate(REF[0], max_new_tokens=5)
    # an in-memory model is fingerprinted by its tensors (evaluation's cache keys): offloaded ones too
    assert parameters_fingerprint(dispatched) == parameters_fingerprint(plain)


def _batch(model) -> Batch:
    enc = model.encode
    answers = torch.tensor([model.tokens(a)[0] for a in ("7", "7", "2")])
    return Batch([0, 1, 2], enc(REF).input_ids, enc(CF).input_ids, answers)


@pytest.mark.parametrize("method", [path_patch_batch, activation_patch_batch, attribution_patch_batch],
                         ids=["path", "activation", "attribution"])
@pytest.mark.parametrize("metric", ["logit-diff", "prob"])
def test_patching_effects(pair, method, metric):
    plain, dispatched, _ = pair
    want, got = method(plain, _batch(plain), metric), method(dispatched, _batch(dispatched), metric)
    for name in ("original", "heads", "mlps"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), **TOL)
    assert (want.heads - want.original[:, None, None]).abs().max() > 1e-6  # the effects are not all zero


def test_patch_command_with_max_memory(pair, tmp_path, monkeypatch):
    plain, dispatched, folder = pair
    loaded = []
    real = models.loading.load_model  # looked up at call time by models.load_placed

    def spy(*args, **kwargs):
        loaded.append(real(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(models.loading, "load_model", spy)
    pairs = write_rows(tmp_path / "pairs.jsonl", make_rows(6))
    common = ["identify", "--model", folder, "--data", str(pairs), "--batch-size", "4", "--top-k", "3", "--quiet"]
    limit = f"cpu={0.8 * _bytes(plain) / 1000:.0f}KB"  # cpu=390KB for the tiny Llama, as in the README
    assert main(common + ["--out", str(tmp_path / "plain"), "--device", "cpu", "--dtype", "float32"]) == 0
    assert main(common + ["--out", str(tmp_path / "auto"), "--device", "auto", "--dtype", "float32",
                          "--max-memory", limit, "--offload-folder", str(tmp_path / "offload")]) == 0
    want, got = (json.loads((tmp_path / run / "effects.json").read_text()) for run in ("plain", "auto"))
    np.testing.assert_allclose(got["heads"], want["heads"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(got["mlps"], want["mlps"], atol=1e-5, rtol=0)
    assert not _offloaded_layers(loaded[0]) and _offloaded_layers(loaded[1])  # the flags reached load_model


def test_head_means_passes_and_curves(pair):
    plain, dispatched, _ = pair
    rows = make_rows(8)
    prompts, cf = [r["reference"] for r in rows], [r["counterfactual"] for r in rows]
    answers = [plain.tokens(r["answer"])[0] for r in rows]
    heads = all_heads(plain)
    sets = [[], heads[:1], heads[-3:], heads[::2]]
    results = []
    for model in (plain, dispatched):
        full = compute_means(model, cf, heads=heads, mlps=[0, 1], progress=False)
        passes = EndPasses(model, PromptSet(model, prompts, batch_size=4), full).predict(sets, answers)
        direct = predict(model, Batches(model, prompts, 4), answers, full.edits())  # heads and MLPs, full forward
        curves = knockout_curves(model, PromptSet(model, prompts, batch_size=4), answers, full, heads, heads,
                                 CurveSettings(k=4, seeds=2), progress=False)
        results.append((full, passes, direct, curves))
    (want_full, want_sets, want_direct, want_curves), (full, got_sets, direct, curves) = results
    for key in want_full.to_state():
        torch.testing.assert_close(full.to_state()[key], want_full.to_state()[key], **TOL)
    for got, want in zip(got_sets + [direct], want_sets + [want_direct]):
        torch.testing.assert_close(got.p_answer, want.p_answer, **TOL)
        assert torch.equal(got.top1, want.top1)
    assert curves.effect == want_curves.effect and curves.random == want_curves.random


def test_attention_by_role_and_mlp_tables(pair, tmp_path):
    plain, dispatched, _ = pair
    pairs = write_rows(tmp_path / "pairs.jsonl", make_rows(6))
    heads = all_heads(plain)[-4:]
    tables = []
    for model in (plain, dispatched):
        samples = load_samples(model, pairs)
        rows = end_attention(model, [s.prompt for s in samples], heads, batch_size=4, progress=False)
        tables.append((rows, by_role(rows, samples), probe(model, samples, batch_size=4, progress=False)))
    (want_rows, want_roles, want_mlp), (rows, roles, mlp) = tables
    for got, want in zip(rows, want_rows):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(roles, want_roles, atol=1e-5, rtol=0)
    assert set(mlp) == set(want_mlp)
    for name in want_mlp:
        np.testing.assert_allclose(mlp[name], want_mlp[name], atol=1e-5, rtol=0)


def test_eval_items(pair, tiny_data, tmp_path):
    plain, dispatched, folder = pair
    pairs = write_rows(tmp_path / "pairs.jsonl", make_rows(4))
    variants = [Variant.make("model", folder),
                Variant.make("knockout", folder, heads=[[0, 1], [2, 0]], mlps=[1], data=str(pairs))]
    items = []
    for name, model in (("plain", plain), ("auto", dispatched)):
        cfg = EvalSettings(benchmarks=("gsm8k", "mmlu", "arith-add"), limit=3, few_shot=1, max_new_tokens=6)
        evaluate(variants, cfg, tmp_path / name / "out", loader=lambda _, model=model: model, data_dir=str(tiny_data),
                 batch_size=2, progress=False, cache_dir=str(tmp_path / name / "cache"))
        items.append({b: read_rows(tmp_path / name / "cache" / f"{b}.sqlite") for b in cfg.benchmarks})
    want, got = items
    for bench in want:
        assert len(got[bench]) == len(want[bench]) > 0
        for g, w in zip(got[bench], want[bench]):
            assert_json_close(g, w, 1e-5, bench)


def test_max_memory_needs_device_auto(tmp_path, capsys):
    pairs = write_rows(tmp_path / "pairs.jsonl", make_rows(2))
    code = main(["identify", "--data", str(pairs), "--out", str(tmp_path / "out"), "--max-memory", "cpu=1GiB"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--max-memory cpu=1GiB: needs --device auto" in err[0]
    code = main(["identify", "--data", str(pairs), "--out", str(tmp_path / "out"), "--device", "auto",
                 "--max-memory", "cpu:1GiB"])
    err = capsys.readouterr().err
    assert code == 2 and "cuda:0=20GiB,cpu=60GiB" in err


def test_offload_is_refused_where_weights_change(tmp_path, capsys):
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"prompt": "1 + 1 = ", "completion": "2"}) + "\n")
    code = main(["finetune", "--train", str(train), "--out", str(tmp_path / "ft"), "--method", "lora",
                 "--device", "auto", "--max-memory", "cpu=1GiB"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--max-memory cpu=1GiB" in err[0] and "resident" in err[0]
    with pytest.raises(SettingError, match="resident"):
        RunSettings.make(out=str(tmp_path / "run"), device="auto", offload_folder=str(tmp_path / "offload"),
                            variants=["lora"], eval=dict(benchmarks=["arith-add"]),
                            finetune=dict(train="arith:multidigit"))

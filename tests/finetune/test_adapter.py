"""What a precise-SFT run leaves behind, on every family: the adapter file puts the trained model back
exactly on a fresh base (and only on that base), merges into a plain Hugging Face folder, exports as a
PEFT LoRA adapter, and runs as an evaluation variant without touching the shared base model; LoRA and
full-SFT run folders load back too."""
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from keyheads.components import Components
from keyheads.errors import SettingError
from keyheads.evaluation.variants import Variant, prepare
from keyheads.finetune import FinetuneSettings, apply_adapter, export_peft, finetune, load_finetuned, merge
from keyheads.finetune.adapter import ADAPTER, AdapterMismatch, read_adapter
from keyheads.finetune.layer import ATTR, in_out
from keyheads.finetune.model import slice_plan
from keyheads.models.fingerprint import base_fingerprint
from keyheads.models.model import HookedModel
from keyheads.numbers import human
from keyheads.testing import TINY_FAMILIES, tiny_model

pytestmark = pytest.mark.slow  # training runs, a LoRA one about 15 s

# Two heads in layer 1 (sharing a K/V group where there are groups), one in layer 2, and MLP 2.
COMPONENTS = Components(((1, 0), (1, 1), (2, 3)), (2,))
SETTINGS = dict(lr=1e-2, optimizer_batch_size=8, micro_batch_size=4, max_steps=3, save_every=0)
SEED = 0
PROMPTS = ["12 + 3 = ", "Q: 4 plus 19? A: 2", "7 + 7 = 1"]  # different lengths: left padding is exercised
# How export_peft carries bias deltas: families whose targets all have biases use lora_bias; Qwen2 (biased
# Q/K/V, bias-free O) uses the targets' own biases, saved by bias="lora_only"; the rest have no biases.
PEFT_BIAS = {"qwen2": "lora_only", "gpt2": "lora_bias", "gpt_neox": "lora_bias", "gpt_neox_serial": "lora_bias"}


@torch.no_grad()
def logits(model: HookedModel, module=None) -> torch.Tensor:
    """Logits at the prompts' real (non-pad) positions, of `module` (default: the model's own HF model)."""
    batch = model.encode(PROMPTS)
    out = (module if module is not None else model.hf)(**batch.as_kwargs(), use_cache=False).logits
    return out[batch.attention_mask.bool()]


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5) -> bool:
    return torch.allclose(a, b, atol=atol, rtol=0)


def assert_changed(trained: torch.Tensor, base: torch.Tensor) -> None:
    assert (trained - base).abs().max() > 1e-2, "training did not change the logits: the test could not fail"


def has_deltas(model: HookedModel) -> bool:
    return any(hasattr(m, ATTR) for m in model.hf.modules())


def load_folder(path: str) -> HookedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return HookedModel(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), name=path,
                       source=path)


def loader_of(family: str, seed: int = SEED):
    """A loader as the evaluator has one: base models by name (shared, cached), model folders by path."""
    shared = {}

    def load(name: str) -> HookedModel:
        if name not in shared:
            if name == f"tiny-{family}":
                shared[name] = tiny_model(family, seed)
            elif Path(name).is_dir():
                shared[name] = load_folder(name)
            else:
                raise KeyError(name)
        return shared[name]

    load.shared = shared
    return load


@dataclass
class Run:
    folder: Path
    info: dict
    base: torch.Tensor  # logits before training
    trained: torch.Tensor  # logits of the trained model itself
    total_params: int


@pytest.fixture(scope="module")
def runs(tmp_path_factory, examples):
    """family -> one short precise-SFT run, trained once per module."""
    done = {}

    def get(family: str) -> Run:
        if family not in done:
            model = tiny_model(family, SEED)
            base = logits(model)
            folder = tmp_path_factory.mktemp(f"precise-{family}")
            info = finetune(model, examples, FinetuneSettings(**SETTINGS), folder, COMPONENTS, progress=False)
            done[family] = Run(folder, info, base, logits(model), sum(p.numel() for p in model.hf.parameters()))
        return done[family]

    return get


# ---- 1. save / apply -------------------------------------------------------------------------------

@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_adapter_round_trip_is_exact(runs, family):
    run = runs(family)
    assert_changed(run.trained, run.base)
    fresh = tiny_model(family, SEED)
    assert torch.equal(logits(fresh), run.base)
    apply_adapter(fresh, run.folder)
    assert torch.equal(logits(fresh), run.trained)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_adapter_holds_only_deltas_and_mlps(runs, family):
    run = runs(family)
    tensors, meta = read_adapter(run.folder)
    model = tiny_model(family, SEED)
    fam = model.family
    assert meta["base_model"] == model.name and meta["base_fingerprint"] == base_fingerprint(model)
    assert Components.from_json(meta["components"]) == COMPONENTS

    expected = {}
    for (layer, path, kind), index in slice_plan(model, COMPONENTS, "group").items():
        module = model.layer_module(layer, path)
        d_in, d_out = in_out(module)
        key = f"delta.{layer}.{path}.{kind}"
        expected[f"{key}.index"] = (len(index),)
        expected[f"{key}.weight"] = (len(index), d_in) if kind == "rows" else (d_out, len(index))
        if kind == "rows" and getattr(module, "bias", None) is not None:
            expected[f"{key}.bias"] = (len(index),)
    mlp_params = {}
    for layer in COMPONENTS.mlps:
        for name, p in model.layer_module(layer, fam.mlp).named_parameters():
            full = f"{fam.layers}.{layer}.{fam.mlp}.{name}"
            expected[f"mlp.{full}"] = tuple(p.shape)
            mlp_params[full] = p
    assert {k: tuple(v.shape) for k, v in tensors.items()} == expected

    # The stored MLP is the trained one (it moved away from the base weights).
    assert any(not torch.equal(tensors[f"mlp.{k}"], p) for k, p in mlp_params.items())
    stored = sum(v.numel() for k, v in tensors.items() if not k.endswith(".index"))
    assert stored == run.info.tuned_params == meta["tuned_params"]
    all_numel = sum(v.numel() for v in tensors.values())
    assert all_numel < 0.4 * run.total_params, (all_numel, run.total_params)
    assert (run.folder / ADAPTER).stat().st_size < 0.5 * 4 * run.total_params  # vs the fp32 model's bytes


# ---- 2. the base is checked ------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_adapter_refuses_another_base(runs, family, tmp_path):
    run = runs(family)
    want = read_adapter(run.folder)[1]["base_fingerprint"]
    other = tiny_model(family, SEED + 1)
    have = base_fingerprint(other)
    assert have != want
    before = logits(other)
    for attempt in (lambda: apply_adapter(other, run.folder),
                    lambda: merge(other, run.folder, tmp_path / "merged"),
                    lambda: export_peft(other, run.folder, tmp_path / "peft")):
        with pytest.raises(AdapterMismatch) as err:
            attempt()
        assert want in str(err.value) and have in str(err.value)
    assert not has_deltas(other) and torch.equal(logits(other), before)
    assert not (tmp_path / "merged").exists() and not (tmp_path / "peft").exists()


# ---- 3. merge into a plain Hugging Face folder -------------------------------------------------------

@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_merge_writes_a_plain_hf_model(runs, family, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    run = runs(family)
    out = tmp_path / "new" / "merged"  # a parent that does not exist yet
    merge(tiny_model(family, SEED), run.folder, out)
    assert sorted(p.name for p in tmp_path.rglob("*") if p.name.startswith(".")) == []  # no temp folder left
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert not [k for k in f.keys() if ATTR in k]

    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    # Not AutoTokenizer: for model_type qwen2, transformers 5 swaps any saved tokenizer class for
    # Qwen2Tokenizer, which is right for Qwen's tokenizer and wrong for the tiny models' char tokenizer.
    tok = PreTrainedTokenizerFast.from_pretrained(out)
    ref = tiny_model(family, SEED).tokenizer
    assert tok(PROMPTS)["input_ids"] == ref(PROMPTS)["input_ids"]
    got = logits(HookedModel(hf, tok))
    assert close(got, run.trained), (got - run.trained).abs().max()


def test_merge_refuses_an_existing_folder_before_touching_the_model(runs, tmp_path):
    run = runs("llama")
    out = tmp_path / "merged"
    out.mkdir()
    model = tiny_model("llama", SEED)
    with pytest.raises(SettingError, match="merged: exists; choose a new folder"):
        merge(model, run.folder, out)
    assert not has_deltas(model) and torch.equal(logits(model), run.base)
    assert [p.name for p in tmp_path.iterdir()] == ["merged"] and not any(out.iterdir())


# ---- 4. PEFT export ------------------------------------------------------------------------------

@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_peft_export_matches(runs, family, tmp_path):
    from peft import PeftModel

    run = runs(family)
    out = tmp_path / "peft"
    export_peft(tiny_model(family, SEED), run.folder, out)
    config = json.loads((out / "adapter_config.json").read_text())
    base = tiny_model(family, SEED)
    fam = base.family
    assert config["modules_to_save"] == [f"{fam.layers}.{layer}.{fam.mlp}" for layer in COMPONENTS.mlps]
    mode = PEFT_BIAS.get(family, "none")
    assert config["lora_bias"] == (mode == "lora_bias") and config["bias"] == ("lora_only" if mode == "lora_only"
                                                                                 else "none")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peft_model = PeftModel.from_pretrained(base.hf, str(out)).eval()
    # e.g. missing adapter keys, or a LoRA bias on a layer without one (which PEFT then cannot merge)
    assert not [str(w.message) for w in caught if any(s in str(w.message).lower() for s in ("missing", "bias"))]
    got = logits(base, peft_model)
    assert close(got, run.trained), (got - run.trained).abs().max()
    merged = peft_model.merge_and_unload()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    got = logits(base, merged)
    assert close(got, run.trained), (got - run.trained).abs().max()


# ---- 5. the evaluation variant ---------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_adapter_variant(runs, family):
    run = runs(family)
    loader = loader_of(family)
    shared = loader(f"tiny-{family}")
    prepared = prepare(Variant.make("adapter", str(run.folder)), loader)
    assert prepared.model.hf is not shared.hf
    assert torch.equal(logits(prepared.model), run.trained)
    assert not has_deltas(shared) and torch.equal(logits(shared), run.base)  # the shared base is untouched
    assert prepared.info["train_speed"].endswith("sam./s")
    assert prepared.info["tuned_params"] == human(run.info.tuned_params)
    assert prepared.info["finetune"] == {"method": "precise", "components": COMPONENTS.to_json()}
    again = prepare(Variant.make("adapter", "ignored", path=str(run.folder)), loader)
    assert again.fingerprint == prepared.fingerprint
    assert torch.equal(logits(again.model), run.trained) and torch.equal(logits(shared), run.base)


# ---- 6. LoRA and full SFT run folders --------------------------------------------------------------

@pytest.mark.parametrize("method", ["lora", "full"])
def test_lora_and_full_runs_load_back(method, examples, tmp_path):
    model = tiny_model("llama", SEED)
    base = logits(model)
    info = finetune(model, examples, FinetuneSettings(method=method, **SETTINGS), tmp_path / "run", progress=False)
    trained = logits(model)
    assert_changed(trained, base)
    assert info.method == method and info.components is None
    assert (tmp_path / "run" / ("lora" if method == "lora" else "model")).is_dir()
    assert not (tmp_path / "run" / ADAPTER).exists()

    loader = loader_of("llama")
    got = logits(load_finetuned(tmp_path / "run", loader))
    # fp32 round-off relative to the logits' size: the loaded adapter sums its products in another order,
    # and the last bits of that order differ between CPUs (1.1e-5 on logits up to 5.3 on some)
    tol = 1e-5 * max(1.0, trained.abs().max().item())
    assert close(got, trained, atol=tol), (got - trained).abs().max()

    loader = loader_of("llama")
    prepared = prepare(Variant.make("adapter", str(tmp_path / "run")), loader)
    # full SFT: nothing is loaded before the row is needed; LoRA: only the base it is merged into
    assert list(loader.shared) == ([] if method == "full" else ["tiny-llama"])
    assert close(logits(prepared.model), trained, atol=tol)
    if method == "lora":  # the shared base is copied before LoRA is merged into it, and stays untouched
        assert loader.shared["tiny-llama"].hf is not prepared.model.hf
        assert torch.equal(logits(loader.shared["tiny-llama"]), base)
    else:  # full SFT's own weights are used as loaded: nothing changes them, so nothing is copied
        assert prepared.model.hf is loader.shared[str(tmp_path / "run" / "model")].hf


def test_lora_run_refuses_another_base(examples, tmp_path):
    model = tiny_model("llama", SEED)
    finetune(model, examples, FinetuneSettings(method="lora", **{**SETTINGS, "max_steps": 1}), tmp_path, progress=False)
    with pytest.raises(AdapterMismatch):
        load_finetuned(tmp_path, loader_of("llama", seed=SEED + 1))


def test_full_sft_of_a_bf16_model_warns_that_small_updates_are_lost(examples, tmp_path):
    settings = {**SETTINGS, "lr": 2e-5, "max_steps": 1, "warmup_ratio": 0.0}
    changed = {}
    for dtype in (torch.bfloat16, torch.float32):
        model = tiny_model("llama", SEED)
        model.hf.to(dtype)
        before = [p.detach().clone() for p in model.hf.parameters()]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            finetune(model, examples, FinetuneSettings(method="full", **settings), tmp_path / str(dtype),
                     progress=False)
        warned = [w for w in caught if "updates smaller than the weights' precision are lost" in str(w.message)]
        assert bool(warned) == (dtype == torch.bfloat16)
        moved = sum(int((p.detach() != b).sum()) for p, b in zip(model.hf.parameters(), before))
        changed[dtype] = moved / sum(b.numel() for b in before)
    # what the warning is about: one Adam step at lr 2e-5 moves almost no bf16 weight
    assert changed[torch.float32] > 0.9 and changed[torch.bfloat16] < 0.2, changed

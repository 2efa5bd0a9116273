"""What a fine-tuning run leaves behind, and how to use it.

- precise: `adapter.safetensors` holds only the deltas (with their feature indices) and the trained
  MLPs' weights; its metadata names the base model and its fingerprint, the components, the K/V
  policy, the settings, the data hash and the versions. `apply_adapter` puts it on a base model,
  `merge` writes a plain Hugging Face folder, `export_peft` writes the same change as a PEFT LoRA
  adapter: a row block is B = selector, A = delta; a column block is B = delta, A = selector.
- full: `model/`, a Hugging Face folder.  lora: `lora/`, a PEFT adapter folder.
Every run folder has `finetune.json` (the same metadata plus the training figures).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..components import Components
from ..errors import BadFile, SettingError, UserError
from ..io import atomic_folder, atomic_path, read_json
from ..models.fingerprint import base_fingerprint
from ..models.model import HookedModel
from ..runfolder import FINETUNE_JSON
from .model import Tuned, precise

ADAPTER = "adapter.safetensors"
INFO = FINETUNE_JSON


class AdapterMismatch(UserError):
    """An adapter put on a base model other than the one it was trained on."""


def save_adapter(tuned: Tuned, folder: str | Path, meta: dict, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Write the adapter; `tensors` are tuned.adapter_tensors() when the caller gathered them already (FSDP2)."""
    path = Path(folder) / ADAPTER
    tensors = tuned.adapter_tensors() if tensors is None else tensors
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"keyheads": json.dumps(meta, sort_keys=True)})
    return path


def read_adapter(folder: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    path = Path(folder) / ADAPTER if Path(folder).is_dir() else Path(folder)
    if not path.is_file():
        raise BadFile(f"{path} does not exist (it is written by `keyheads finetune --method precise`)")
    try:
        with safe_open(str(path), "pt") as f:
            metadata = f.metadata() or {}
            meta = json.loads(metadata["keyheads"]) if "keyheads" in metadata else {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as err:  # a truncated or foreign file
        raise BadFile(f"{path} cannot be read ({err}): it is truncated or not a safetensors file; "
                      "copy it again or re-run `keyheads finetune`") from None
    if "components" not in meta:
        raise BadFile(f"{path} has no keyheads metadata; is it a keyheads precise-SFT adapter?")
    return tensors, meta


def check_base(model: HookedModel, meta: dict, what: str) -> None:
    have = base_fingerprint(model)
    base = {"base_model": None, "base_fingerprint": None} | meta  # a file keyheads did not write may lack them
    want = base["base_fingerprint"]
    if want != have:
        raise AdapterMismatch(f"{what} was trained on base model {base['base_model']!r} (fingerprint {want}), "
                              f"but {model.name!r} has fingerprint {have}: load it onto the model it was trained on")


def apply_adapter(model: HookedModel, folder: str | Path, check: bool = True) -> Tuned:
    """Put a precise-SFT adapter on `model` (in place): deltas attached, MLP weights replaced."""
    tensors, meta = read_adapter(folder)
    if check:
        check_base(model, meta, str(folder))
    tuned = precise(model, Components.from_json(meta["components"]), meta["config"]["kv"])
    expected = set(tuned.adapter_tensors())
    if expected != set(tensors):
        raise BadFile(f"{folder}: its tensors do not match its own metadata (missing "
                      f"{sorted(expected - set(tensors))[:3]}, extra {sorted(set(tensors) - expected)[:3]}): "
                      "it was changed after training; re-run `keyheads finetune`")
    with torch.no_grad():
        for key, delta in tuned.deltas.items():
            prefix = f"delta.{key}.{delta.kind}"
            if not torch.equal(tensors[f"{prefix}.index"], delta.index.cpu()):
                raise BadFile(f"{folder}: the feature indices of {key} differ from this model's head layout; "
                              "re-run `keyheads finetune`")
            delta.weight.copy_(tensors[f"{prefix}.weight"])
            if delta.bias is not None:
                delta.bias.copy_(tensors[f"{prefix}.bias"])
        params = dict(model.hf.named_parameters())
        for key, value in tensors.items():
            if key.startswith("mlp."):
                params[key[len("mlp."):]].copy_(value)
    model.hf.requires_grad_(False)
    return tuned


def merge_adapter(tuned: Tuned) -> None:
    """Fold the deltas into the base weights (in place) and take them off."""
    for key, delta in tuned.deltas.items():
        delta.merge_into(tuned.projection(key))
    tuned.remove()


def check_new_folder(out: str | Path, key: str = "--out") -> Path:
    """The one check that the folder a merge writes does not exist yet."""
    out = Path(out)
    if out.exists():
        raise SettingError(key, str(out), "exists; choose a new folder")
    return out


def merge(model: HookedModel, folder: str | Path, out: str | Path) -> Path:
    """A plain Hugging Face model folder with the adapter folded in (loads with AutoModelForCausalLM).

    `model` is the base model; it is modified (the adapter is merged into it).
    """
    out = check_new_folder(out)  # before any work, and before `model` is modified
    tuned = apply_adapter(model, folder)
    merge_adapter(tuned)
    # Written next to `out` and renamed into place: a crash leaves no half-written model folder.
    with atomic_folder(out) as tmp:
        model.hf.save_pretrained(tmp, safe_serialization=True)
        if model.tokenizer is not None:
            model.tokenizer.save_pretrained(tmp)
        check_new_folder(out)  # made while we saved
    return out


def export_peft(model: HookedModel, folder: str | Path, out: str | Path) -> Path:
    """Write the adapter as a PEFT LoRA adapter folder; `model` is a fresh base model (it is modified).

    Bias deltas go into `lora_B`'s bias (`lora_bias=True`) when every targeted projection has a bias.
    Where some do not (Qwen2: biased Q/K/V, bias-free O), PEFT would still give every target a LoRA
    bias and then refuse to merge the adapter, so the deltas are added to the targets' own biases,
    which PEFT saves and loads with `bias="lora_only"`.
    """
    from peft import LoraConfig, get_peft_model

    tensors, meta = read_adapter(folder)
    check_base(model, meta, str(folder))
    fam, prefix = model.family, model.family.layers
    modules, ranks, bias = [], {}, False
    for key in tensors:
        if key.startswith("delta.") and key.endswith(".index"):
            _, layer_path, kind, _ = _split_delta_key(key)
            name = f"{prefix}.{layer_path}"
            modules.append(name)
            ranks[name] = tensors[key].numel()
            bias = bias or f"delta.{layer_path}.{kind}.bias" in tensors
    mlps = [f"{prefix}.{layer}.{fam.mlp}" for layer in meta["components"]["mlps"]]
    if not modules:
        raise SettingError(f"{folder} trains no head, only MLPs; a LoRA export needs at least one head: "
                           "use --export hf")
    lora_bias = bias and all(getattr(model.module(name), "bias", None) is not None for name in modules)
    config = LoraConfig(r=1, lora_alpha=1, target_modules=modules, rank_pattern=ranks, alpha_pattern=dict(ranks),
                        lora_dropout=0.0, fan_in_fan_out=fam.conv1d, lora_bias=lora_bias,
                        bias="lora_only" if bias and not lora_bias else "none",
                        modules_to_save=mlps or None)
    peft_model = get_peft_model(model.hf, config)
    named = dict(peft_model.named_modules())
    with torch.no_grad():
        for key in tensors:
            if not (key.startswith("delta.") and key.endswith(".index")):
                continue
            _, layer_path, kind, _ = _split_delta_key(key)
            lora_module = named[f"base_model.model.{prefix}.{layer_path}"]
            index, weight = tensors[key], tensors[f"delta.{layer_path}.{kind}.weight"]
            A, B = lora_module.lora_A["default"], lora_module.lora_B["default"]
            selector = torch.zeros(B.weight.shape if kind == "rows" else A.weight.shape, dtype=A.weight.dtype)
            if kind == "rows":  # out[idx] += dW x: A = dW, B = selector [out, r]
                selector[index, torch.arange(len(index))] = 1
                A.weight.copy_(weight)
                B.weight.copy_(selector)
                delta_bias = tensors.get(f"delta.{layer_path}.{kind}.bias")
                if B.bias is not None:
                    B.bias.zero_()
                    if delta_bias is not None:
                        B.bias[index] = delta_bias.to(B.bias.dtype)
                elif delta_bias is not None:  # bias="lora_only": saved with the adapter
                    base_bias = lora_module.get_base_layer().bias
                    base_bias[index] += delta_bias.to(base_bias.dtype)
            else:  # out += dW x[idx]: A = selector [r, in], B = dW
                selector[torch.arange(len(index)), index] = 1
                A.weight.copy_(selector)
                B.weight.copy_(weight)
                if B.bias is not None:
                    B.bias.zero_()
        for key, value in tensors.items():
            if key.startswith("mlp."):
                layer_mlp, _, param = key[len("mlp."):].partition(f".{fam.mlp}.")
                wrapper = named[f"base_model.model.{layer_mlp}.{fam.mlp}"]
                dict(wrapper.modules_to_save["default"].named_parameters())[param].copy_(value)
    Path(out).mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # PEFT 0.21 takes lora_B's (1-D) bias for an unsharded FSDP tensor
        warnings.filterwarnings("ignore", message=r".*LoRA tensor\(s\) have invalid shape")
        peft_model.save_pretrained(str(out))
    return Path(out)


def _split_delta_key(key: str) -> tuple[str, str, str, str]:
    """'delta.3.self_attn.q_proj.rows.index' -> ('delta', '3.self_attn.q_proj', 'rows', 'index')."""
    head, field = key.rsplit(".", 1)
    head, kind = head.rsplit(".", 1)
    _, layer_path = head.split(".", 1)
    return "delta", layer_path, kind, field


INFO_KEYS = ("base_model", "base_fingerprint", "method", "tuned_params", "train")


def read_info(folder: str | Path) -> dict:
    path = Path(folder) / INFO
    if not path.is_file():
        raise BadFile(f"{path} does not exist: {folder} is not a finished `keyheads finetune` run folder")
    try:
        info = read_json(path)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadFile(f"{path} is not valid JSON ({err}): re-run `keyheads finetune` into {folder}") from None
    missing = [k for k in INFO_KEYS if not isinstance(info, dict) or k not in info]
    if missing:
        raise BadFile(f"{path} lacks {', '.join(missing)}: {folder} is not a finished `keyheads finetune` run "
                      "folder (re-run `keyheads finetune` into it)")
    return info


def check_run_folder(folder: str | Path) -> dict:
    """Read a run folder's finetune.json, and a precise run's adapter, before any model loads."""
    info = read_info(folder)
    if info["method"] == "precise":
        read_adapter(folder)
    return info


def load_finetuned(folder: str | Path, loader) -> HookedModel:
    """The fine-tuned model of any method's run folder; `loader(name)` loads a base model."""
    folder = Path(folder)
    info = read_info(folder)
    if info["method"] == "full":
        return loader(str(folder / "model"))
    model = loader(info["base_model"])
    if info["method"] == "precise":
        apply_adapter(model, folder)
        return model
    from peft import PeftModel

    check_base(model, info, str(folder))
    model.hf = PeftModel.from_pretrained(model.hf, str(folder / "lora")).merge_and_unload().eval()
    model.layers = model.module(model.family.layers)
    return model

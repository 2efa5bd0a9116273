"""The three ways to make a model trainable: precise SFT, full SFT and LoRA.

Each returns a `Tuned`: the module to call in training, its trainable parameters in optimizer
groups, the per-step hooks the recipe needs (the H/h gradient rescale, weight decay that acts on
W0 + delta) and the tensors an adapter file stores.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..components import Components
from ..errors import MissingPackage, SettingError
from ..models.model import HookedModel
from .layer import ATTR, ColDelta, RowDelta, attach, detach
from .settings import FinetuneSettings


def slice_plan(model: HookedModel, components: Components, kv: str = "group") -> dict[tuple[int, str, str], list[int]]:
    """(layer, layer-relative module path, "rows"|"cols") -> sorted feature indices to train."""
    fam, config = model.family, model.config
    plan: dict[tuple[int, str, str], set[int]] = {}
    components.check(model.n_layers, model.n_heads)
    for layer, heads in components.heads_by_layer().items():
        blocks = [fam.qkv_rows(config, "q", h) for h in heads]
        if kv == "group":
            kv_heads = sorted({fam.kv_head_of(config, h) for h in heads})
            blocks += [fam.qkv_rows(config, kind, g) for g in kv_heads for kind in ("k", "v")]
        for path, index in blocks:
            plan.setdefault((layer, path, "rows"), set()).update(index)
        for h in heads:
            path, index = fam.o_cols(config, h)
            plan.setdefault((layer, path, "cols"), set()).update(index)
    return {key: sorted(index) for key, index in sorted(plan.items())}


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value (a collective for an FSDP2 shard: every process must call it)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of a parameter: its shard under FSDP2, else the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def count_params(params) -> int:
    return sum(p.numel() for p in params)


def _decay_groups(named: list[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    """Hugging Face Trainer's rule: weight matrices decay, biases and norm weights do not."""
    decay = [p for _, p in named if p.ndim >= 2]
    rest = [p for _, p in named if p.ndim < 2]
    return [g for g in ({"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0})
            if g["params"]]


@dataclass
class Tuned:
    """A model made trainable.

    Attributes:
        model: the HookedModel (its `hf` is what the base weights live in).
        method: "precise", "full" or "lora".
        module: what training calls (the HF model, or a PEFT wrapper of it).
        components: the heads and MLPs trained (precise only).
        deltas: "layer.path" -> RowDelta/ColDelta (precise only).
    """

    model: HookedModel
    method: str
    module: nn.Module
    components: Components = field(default_factory=Components)
    deltas: dict[str, nn.Module] = field(default_factory=dict)
    kv: str = "group"
    seed: int = 0  # LoRA's factors' (lora_factors)

    # ---- parameters --------------------------------------------------------------------------
    def named_trainable(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    @property
    def n_trainable(self) -> int:
        """Trained parameters, the paper's "Tuned Params." (a tied embedding counts once)."""
        return count_params(p for _, p in self.named_trainable())

    def param_groups(self, weight_decay: float) -> list[dict]:
        named = self.named_trainable()
        if self.method != "precise":
            return _decay_groups(named, weight_decay)
        delta_ids = {id(p) for d in self.deltas.values() for p in d.parameters()}
        others = [(n, p) for n, p in named if id(p) not in delta_ids]
        # Delta weights decay towards -W0 (see decay_deltas), so AdamW's own decay is off for them.
        groups = [{"params": [p for d in self.deltas.values() for p in d.parameters()], "weight_decay": 0.0}]
        return [g for g in groups if g["params"]] + _decay_groups(others, weight_decay)

    # ---- per-step hooks of the recipe ---------------------------------------------------------
    def grad_scales(self) -> dict[str, float]:
        """The paper's H/h of each delta ("layer.path"): heads in its layer / heads trained there."""
        per_layer = {layer: len(heads) for layer, heads in self.components.heads_by_layer().items()}
        return {key: self.model.n_heads / per_layer[delta.layer] for key, delta in self.deltas.items()}

    def rescale_grads(self) -> None:
        """The paper's H/h: a layer's head gradients times (heads in the layer / heads trained there)."""
        for key, scale in self.grad_scales().items():
            for p in self.deltas[key].parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)

    @torch.no_grad()
    def decay_deltas(self, lr: float, weight_decay: float) -> None:
        """Decoupled decay of the trained entries of W = W0 + delta, as if they were trained directly."""
        if weight_decay == 0:
            return
        for delta in self.deltas.values():
            weight = local(delta.weight)  # under FSDP2, `base` holds the same shard's entries of W0
            weight.sub_((delta.base + weight) * (lr * weight_decay))

    # ---- what an adapter stores ---------------------------------------------------------------
    def adapter_tensors(self) -> dict[str, torch.Tensor]:
        """Deltas (weight, bias, index) by "layer.path", and the trained MLPs' parameters by HF name.

        Under FSDP2 this gathers the shards: every process calls it, in the same order."""
        out = {}
        for key, delta in self.deltas.items():
            out[f"delta.{key}.{delta.kind}.weight"] = delta.weight
            out[f"delta.{key}.{delta.kind}.index"] = delta.index
            if delta.bias is not None:
                out[f"delta.{key}.{delta.kind}.bias"] = delta.bias
        prefix = self.model.family.layers
        for layer in self.components.mlps:
            mlp = self.model.layer_module(layer, self.model.family.mlp)
            for name, p in mlp.named_parameters():
                if ATTR not in name:
                    out[f"mlp.{prefix}.{layer}.{self.model.family.mlp}.{name}"] = p
        return {k: whole(v.detach()).contiguous().cpu() for k, v in out.items()}

    def remove(self) -> None:
        """Take the deltas off again (the base weights are untouched)."""
        for key in self.deltas:
            detach(self.projection(key))
        self.deltas = {}

    def projection(self, key: str) -> nn.Module:
        """The projection a delta acts on, from its "layer.path" key."""
        layer, _, path = key.partition(".")
        return self.model.layer_module(int(layer), path)


def check_components(components: Components | None) -> Components:
    """The one check that precise SFT has something to train: heads, MLPs or both."""
    if components is None or not (components.heads or components.mlps):
        raise SettingError("precise SFT needs heads or MLPs: --effects F --top-k K, --heads L.H,..., "
                           "--random-heads K, and/or --mlps M / --mlp-layers L,...")
    return components


def precise(model: HookedModel, components: Components | None, kv: str = "group") -> Tuned:
    """Freeze everything; attach zero deltas on the heads' slices; unfreeze whole MLPs."""
    components = check_components(components)
    plan = slice_plan(model, components, kv)
    model.hf.requires_grad_(False)
    deltas = {}
    for (layer, path, kind), index in plan.items():
        module = model.layer_module(layer, path)
        delta = (RowDelta if kind == "rows" else ColDelta)(module, index, layer)
        attach(module, delta)
        deltas[f"{layer}.{path}"] = delta
    for layer in components.mlps:
        model.layer_module(layer, model.family.mlp).requires_grad_(True)
    return Tuned(model, "precise", model.hf, components, deltas, kv)


def full(model: HookedModel) -> Tuned:
    model.hf.requires_grad_(True)
    return Tuned(model, "full", model.hf)


def attention_module_names(model: HookedModel) -> list[str]:
    """The leaf names of the Q/K/V/O projections, as PEFT's target_modules."""
    fam = model.family
    paths = [fam.qkv_proj] if fam.qkv_proj else [fam.q_proj, fam.k_proj, fam.v_proj]
    return sorted({p.rsplit(".", 1)[-1] for p in paths + [fam.attn_out_proj] if p is not None})


def lora(model: HookedModel, rank: int, alpha: float | None = None, seed: int = 0) -> Tuned:
    """PEFT LoRA on every attention projection (q, k, v, o)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise MissingPackage("LoRA needs peft: pip install 'peft>=0.13' (or keyheads[finetune])") from err
    model.hf.requires_grad_(False)
    config = LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else rank, lora_dropout=0.0,
                        target_modules=attention_module_names(model), fan_in_fan_out=model.family.conv1d,
                        bias="none")
    module = get_peft_model(model.hf, config)
    if not any(p.is_meta for p in module.parameters()):  # else FSDP.prepare sets them, once sharded
        with torch.no_grad():
            for name, value in lora_factors(module, seed).items():
                module.get_parameter(name).copy_(value)
    return Tuned(model, "lora", module, seed=seed)


def lora_factors(module: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """LoRA's starting factors, whole, from `seed` alone: A as PEFT draws it (Kaiming-uniform, a=sqrt(5)),
    B zero. Drawn here in a fixed order with their own generator, so that a model loaded whole and one whose
    weights are read after sharding (meta factors until then) start from the same values."""
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in module.named_parameters():
        if ".lora_A." in name:
            out[name] = nn.init.kaiming_uniform_(torch.empty(p.shape, dtype=p.dtype), a=math.sqrt(5),
                                                 generator=generator)
        elif ".lora_B." in name:
            out[name] = torch.zeros(p.shape, dtype=p.dtype)
    return out


def make_trainable(model: HookedModel, cfg: FinetuneSettings, components: Components | None = None) -> Tuned:
    if cfg.method == "precise":
        return precise(model, components, cfg.kv)
    if cfg.method == "full":
        return full(model)
    return lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.seed)

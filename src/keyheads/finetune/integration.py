"""Precise SFT inside the trainers fine-tuners already run: Hugging Face `Trainer` and TRL's `SFTTrainer`.

    sft = attach(model, "runs/add/identify/key_heads.json")      # a transformers causal LM, changed in place
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                         optimizers=(sft.optimizer(args), None), callbacks=[sft.callback("runs/ft/sft")])
    trainer.train()                          # the callback writes adapter.safetensors + finetune.json

`attach` is keyheads' own `precise()` on the model (the same slice deltas, as children of the projections
they act on, so every module keeps its name). The rest of the recipe goes in through the trainer's own
extension points, each chosen because it acts where `keyheads finetune`'s loop (train.py) acts:

- the H/h rescale: a gradient hook multiplies each delta tensor's gradient by its layer's H/h during
  backward, so the trainer's clipping sees the rescaled gradients, as in train.py (rescale, then clip).
  With one micro-batch per step it is the same multiplication of the same numbers; with gradient
  accumulation each micro-batch's part is scaled before the sum, which is equal up to rounding (exact when
  H/h is a power of two). The hook is placed by a forward pre-hook of the delta module on the tensor the
  delta computes with at that moment: FSDP2 (`fully_shard`, as accelerate applies it) replaces every
  parameter by a new DTensor and computes with yet another, gathered, tensor, so a hook placed on the
  parameters at `attach` would never run; the delta module itself stays.
- the optimizer: `optimizer(args)` is train.py's `make_optimizer` (delta weights without AdamW's own decay,
  the HF rule for whole MLPs), for `Trainer(optimizers=(..., None))`; the trainer builds its own schedule on
  it. The Trainer refuses a built optimizer under FSDP, so `optimizer_cls_and_kwargs(args)` gives the same
  optimizer as the factory `Trainer(optimizer_cls_and_kwargs=...)` builds it from (accelerate then moves it
  onto the sharded parameters); it works without FSDP too.
- the weight decay of W0 + delta: a step pre-hook on that optimizer runs `Tuned.decay_deltas` with the
  learning rate the step is about to use, right before each optimizer step, as train.py does. A step the
  trainer skips (fp16 overflow) decays nothing, since the hook runs only when the step does. Under FSDP2
  each process decays its own shard, against the same shard of W0.

`save` (and the callback, at the end and at each of the trainer's checkpoints) writes the same
`adapter.safetensors` + `finetune.json` as `keyheads finetune`, so `keyheads eval --adapter`, `keyheads
merge` and `--export peft` read it unchanged, and refuse it on another base model.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils.weak import WeakIdKeyDictionary
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..components import Components
from ..effects import Effects
from ..errors import SettingError, UserError
from ..heads import parse_layers
from ..io import read_json, write_json
from ..models.fingerprint import base_fingerprint
from ..models.model import HookedModel
from ..provenance import versions
from .adapter import INFO, save_adapter
from .layer import ATTR
from .model import Tuned, local, precise
from .settings import FinetuneSettings
from .train import make_optimizer

HANDLE = "_keyheads_precise_sft"  # where attach leaves its handle on the model, for save(model, ...)
# TrainingArguments.optim -> the optimizer keyheads builds for it (train.make_optimizer)
OPTIMIZERS = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "sgd": "sgd", "adamw_bnb_8bit": "adamw8bit",
              "adamw_8bit": "adamw8bit"}


def choose_components(model: HookedModel, heads: Components | str | Path, top_k: int | None = None,
                      mlps: int | list[int] | str | None = None) -> Components:
    """The heads and MLPs to train: `Components`, or a key_heads.json (its heads in order; `top_k` keeps the
    first K) or an effects.json (the key heads by the same rule as `keyheads finetune --effects F --top-k K`).
    `mlps`: a number (the top M by effect, from an effects.json) or explicit layers."""
    effects = None
    if isinstance(heads, Components):
        if top_k is not None:
            raise SettingError("top_k chooses from a key_heads.json or effects.json; with Components, choose the "
                               "heads yourself")
        chosen = heads
    else:
        path = Path(heads)
        record = read_json(path) if path.is_file() else None
        rows = record.get("heads") if isinstance(record, dict) else None
        if isinstance(rows, list) and rows and isinstance(rows[0], list):  # effects.json: [layers][heads]
            effects = Effects.load(path, model)
            chosen = Components.select(effects, top_k=top_k, name=path.name)
        else:
            chosen = Components.read_key_heads(path)  # names the file when it is missing or not a key_heads.json
            if top_k is not None:
                if not 1 <= top_k <= len(chosen.heads):
                    raise UserError(f"{path} lists {len(chosen.heads)} key heads; top_k must be 1..{len(chosen.heads)}")
                chosen = Components(chosen.heads[:top_k], (), f"top-{top_k} {chosen.source}")
    if isinstance(mlps, int) and mlps:
        if effects is None:
            raise SettingError("mlps=M takes the top M MLPs by effect: give an effects.json, or list the layers")
        chosen = chosen.with_mlps(Components.select(effects, top_k=0, n_mlps=mlps, name=str(heads)).mlps,
                                  f"top-{mlps} MLPs")
    elif isinstance(mlps, str) and mlps:
        chosen = chosen.with_mlps(parse_layers(mlps), f"MLPs {mlps}")
    elif isinstance(mlps, (list, tuple)) and mlps:
        chosen = chosen.with_mlps(mlps, f"MLPs {','.join(map(str, mlps))}")
    return chosen.check(model.n_layers, model.n_heads)


def _scaled(grad: torch.Tensor, scale: float) -> torch.Tensor:
    return grad * scale


def _rescale_on_use(delta: nn.Module, args: Any, *, scale: float, hooked: WeakIdKeyDictionary) -> None:
    """Forward pre-hook of a delta module: hook the gradient of the tensors it is about to compute with, once
    per tensor. That is the parameter itself on one process or under DDP, and under FSDP2 the gathered
    (unsharded) tensor FSDP2 computes with and keeps from step to step. Recomputation under gradient
    checkpointing meets the tensors hooked already."""
    for p in (delta.weight, delta.bias):
        if p is not None and p.requires_grad and p not in hooked:
            hooked[p] = p.register_hook(functools.partial(_scaled, scale=scale))


def _shard_bases(tuned: Tuned) -> None:
    """Under FSDP2 (a delta's weight is a DTensor shard), keep only this shard's entries of W0 in `base`, as
    keyheads' own FSDP2 set-up does, so that `decay_deltas` decays each shard against its own W0. Every
    process holds the whole of W0, so each cuts its own shard without talking to the others; the test (whole
    shape) reads the same on every process until the cut."""
    for delta in tuned.deltas.values():
        weight = delta.weight
        if isinstance(weight, DTensor) and delta.base.shape == weight.shape:
            delta.base = distribute_tensor(delta.base.to(weight.device), weight.device_mesh, weight.placements,
                                           src_data_rank=None).to_local().to(local(weight).device)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _optim_name(args) -> str:
    return str(getattr(args.optim, "value", args.optim))


def settings_from_args(args, kv: str = "group", rescale: bool = True) -> FinetuneSettings:
    """keyheads' record of the recipe a `TrainingArguments` (or TRL `SFTConfig`) trains with."""
    name = _optim_name(args)
    if name not in OPTIMIZERS:
        raise SettingError("optim", name, f"is not one of the optimizers precise SFT builds ({', '.join(OPTIMIZERS)})")
    warmup = float(args.warmup_steps)
    max_length = getattr(args, "max_length", None)
    saves = str(getattr(args.save_strategy, "value", args.save_strategy)) == "steps"
    return FinetuneSettings.from_json(dict(
        method="precise", kv=kv, lr=args.learning_rate,
        optimizer_batch_size=args.per_device_train_batch_size * args.gradient_accumulation_steps
        * max(args.world_size, 1),
        micro_batch_size=args.per_device_train_batch_size, epochs=float(args.num_train_epochs),
        max_steps=args.max_steps if args.max_steps > 0 else None, warmup_ratio=warmup if warmup < 1 else 0.0,
        weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm, rescale=rescale,
        optimizer=OPTIMIZERS[name], adam_betas=(args.adam_beta1, args.adam_beta2), adam_eps=args.adam_epsilon,
        seed=args.seed, save_every=int(args.save_steps) if saves else 0, save_minutes=0.0,
        max_length=max_length if isinstance(max_length, int) and max_length > 0 else 1024))


def trainer_record(args) -> dict:
    """What the trainer decides beyond keyheads' settings (its schedule, precision, sampler), for finetune.json."""
    def plain(value):
        return getattr(value, "value", value)
    return {"arguments": type(args).__name__, "optim": _optim_name(args),
            "lr_scheduler_type": str(plain(args.lr_scheduler_type)), "warmup_steps": args.warmup_steps,
            "bf16": bool(args.bf16), "fp16": bool(args.fp16),
            "gradient_checkpointing": bool(args.gradient_checkpointing),
            "train_sampling_strategy": str(plain(getattr(args, "train_sampling_strategy", "random")))}


@dataclass
class PreciseSFT:
    """Precise SFT attached to a model (see `attach`): which heads, the recipe, the hooks it placed.

    Attributes:
        tuned: keyheads' `Tuned` (its `model.hf` is the model given to `attach`; `deltas` the slice deltas).
        base_fingerprint: the base model's, taken before the deltas were attached.
        rescale: whether the H/h gradient hooks are on.
        settings: the recipe, once `optimizer(args)` or `save(..., args)` saw the trainer's arguments.
    """

    tuned: Tuned
    base_fingerprint: str
    rescale: bool = True
    settings: FinetuneSettings | None = None
    trainer: dict = field(default_factory=dict)
    _hooks: list = field(default_factory=list, repr=False)
    _grad_hooks: WeakIdKeyDictionary = field(default_factory=WeakIdKeyDictionary, repr=False)

    @property
    def model(self) -> nn.Module:
        return self.tuned.model.hf

    @property
    def components(self) -> Components:
        return self.tuned.components

    @property
    def kv(self) -> str:
        return self.tuned.kv

    @property
    def n_trainable(self) -> int:
        """The trained parameters (the paper's "Tuned Params.")."""
        return self.tuned.n_trainable

    def recipe(self, args) -> FinetuneSettings:
        """The recipe these trainer arguments give, remembered for `save`."""
        self.settings = settings_from_args(args, self.kv, self.rescale)
        self.trainer = trainer_record(args)
        return self.settings

    def optimizer(self, args) -> torch.optim.Optimizer:
        """keyheads' optimizer for `Trainer(optimizers=(this, None))`: train.py's `make_optimizer` from `args`
        (lr, betas, eps, weight decay, optim), with the decay of W0 + delta as a step pre-hook."""
        cfg = self.recipe(args)
        optimizer = make_optimizer(self.tuned, cfg)
        first = next((p for d in self.tuned.deltas.values() for p in d.parameters()), None)
        if cfg.weight_decay and first is not None:
            group = next(i for i, g in enumerate(optimizer.param_groups) if any(p is first for p in g["params"]))
            optimizer.register_step_pre_hook(functools.partial(_decay, tuned=self.tuned, group=group,
                                                               weight_decay=cfg.weight_decay))
        return optimizer

    def optimizer_cls_and_kwargs(self, args) -> tuple[Callable[[], Callable[..., torch.optim.Optimizer]], dict]:
        """`optimizer(args)` for `Trainer(optimizer_cls_and_kwargs=this)`, the way to give it under FSDP, where
        the Trainer refuses `optimizers=`: the Trainer builds it on the model it trains (before accelerate
        shards that model and moves the optimizer onto the shards). Works without FSDP too."""
        return functools.partial(_OptimizerFactory, self, args), {}

    def callback(self, out_dir: str | Path, data_name: str = "") -> PreciseSFTCallback:
        """A TrainerCallback that writes the adapter into `out_dir` at the end of training, and into each of
        the trainer's own checkpoint folders."""
        return PreciseSFTCallback(self, out_dir, data_name)

    def save(self, out_dir: str | Path, args=None, *, train: dict | None = None, data: dict | None = None) -> Path:
        """Write `adapter.safetensors` + `finetune.json` into `out_dir` (made if missing), as `keyheads finetune`
        does. Every process calls it (under FSDP2 the shards are gathered); the first one writes."""
        if args is not None:
            self.recipe(args)
        config = (self.settings.to_json() if self.settings is not None
                  else {"method": "precise", "kv": self.kv, "rescale": self.rescale})
        model = self.tuned.model
        meta = {"base_model": model.name, "base_fingerprint": self.base_fingerprint, "method": "precise",
                "components": self.components.to_json(),
                "data": {"name": "", "sha256": None, "n": None, **(data or {})}, "config": config, "kv": self.kv,
                "versions": versions(), "tuned_params": self.n_trainable}
        tensors = self.tuned.adapter_tensors()  # a collective under FSDP2
        out = Path(out_dir)
        if _rank() == 0:
            out.mkdir(parents=True, exist_ok=True)
            save_adapter(self.tuned, out, meta, tensors=tensors)
            total = sum(p.numel() for n, p in model.hf.named_parameters() if f".{ATTR}." not in f".{n}")
            # keyheads eval shows train.samples_per_second: unknown (NaN) when no trainer reported it
            train = train or {"steps": None, "samples_per_second": float("nan"), "final_loss": None, "losses": []}
            write_json(out / INFO, {**meta, "total_params": total, "train": train, "trainer": self.trainer})
        return out

    def remove(self) -> None:
        """Take the deltas and hooks off again; the model is the base model it was."""
        for hook in [*self._hooks, *self._grad_hooks.values()]:
            hook.remove()
        self._hooks, self._grad_hooks = [], WeakIdKeyDictionary()
        self.tuned.remove()
        self.model.__dict__.pop(HANDLE, None)

    def _hook_rescale(self) -> None:
        for key, scale in self.tuned.grad_scales().items():
            self._hooks.append(self.tuned.deltas[key].register_forward_pre_hook(
                functools.partial(_rescale_on_use, scale=scale, hooked=self._grad_hooks)))


def _index_out_of_state_dict(delta: nn.Module) -> None:
    """Keep a delta's `index` (which features it trains: structure, fixed by the components) out of the
    model's state dict, as a non-persistent buffer like `base`. The trainer's checkpoints and
    `save_pretrained` then hold only what trains; and accelerate's FSDP2 loading with
    `cpu_ram_efficient_loading` (`accelerate launch --use_fsdp` turns it on) takes every state-dict entry for
    a sharded parameter and fails on a plain buffer (huggingface/accelerate#3898). The adapter still
    records the index (Tuned.adapter_tensors)."""
    index = delta.index
    delattr(delta, "index")
    delta.register_buffer("index", index, persistent=False)


class _OptimizerFactory:
    """What `Trainer(optimizer_cls_and_kwargs=(factory, {}))` calls: the Trainer makes the factory, then calls
    it with the model it trains; that must be the model `attach` changed."""

    def __init__(self, handle: PreciseSFT, args):
        self.handle, self.args = handle, args

    def __call__(self, model: nn.Module, **kwargs) -> torch.optim.Optimizer:
        trained = {id(p) for p in model.parameters() if p.requires_grad}
        if trained != {id(p) for _, p in self.handle.tuned.named_trainable()}:
            raise UserError("the Trainer trains another model than the one precise SFT was attached to "
                            "(keyheads.finetune.attach)")
        return self.handle.optimizer(self.args)


def _decay(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any, *, tuned: Tuned, group: int,
           weight_decay: float) -> None:
    """Before each optimizer step, train.py's decay of W0 + delta at the learning rate of that step."""
    _shard_bases(tuned)
    tuned.decay_deltas(optimizer.param_groups[group]["lr"], weight_decay)


def _hooked(model, name: str | None) -> HookedModel:
    if isinstance(model, HookedModel):
        return model
    if not isinstance(model, nn.Module) or getattr(model, "config", None) is None:
        raise UserError(f"attach takes a transformers causal LM (a PreTrainedModel), not a {type(model).__name__}")
    training = model.training
    path = getattr(model.config, "_name_or_path", "") or ""
    # An in-memory model (from_config) has no path; "" would read as the current folder when fingerprinting.
    hooked = HookedModel(model, None, name=name or path or type(model).__name__, source=path or "<in memory>")
    model.train(training)  # HookedModel sets eval mode; the trainer decides
    return hooked


def attach(model, heads: Components | str | Path, *, top_k: int | None = None,
           mlps: int | list[int] | str | None = None, kv: str = "group", rescale: bool = True,
           name: str | None = None) -> PreciseSFT:
    """Make `model` precise-SFT trainable in place and return its handle.

    Args:
        model: a transformers causal LM of a family keyheads supports (or a keyheads HookedModel).
        heads: `Components`, or the path of a key_heads.json or effects.json (from `keyheads identify`).
        top_k: with a file, how many key heads (key_heads.json: its first K; effects.json: the K most negative).
        mlps: whole MLP layers to train too: a number (the top M of an effects.json) or a list of layers.
        kv: "group" (also the K/V rows of the chosen heads' groups) or "none" (Q rows and O columns only).
        rescale: the paper's H/h gradient rescale (as gradient hooks).
        name: the name `keyheads eval --adapter` loads the base by (default: the model's `name_or_path`).

    Afterwards the model's only trainable parameters are the slice deltas (and the chosen MLPs), and every
    module keeps its name. The base fingerprint is taken first, so `save` records the base, not the deltas.
    """
    hooked = _hooked(model, name)
    if HANDLE in hooked.hf.__dict__:
        raise UserError("this model carries precise-SFT deltas already; call .remove() on its handle first")
    if kv not in ("group", "none"):
        raise SettingError("kv", kv, "must be 'group' or 'none'")
    components = choose_components(hooked, heads, top_k, mlps)
    fingerprint = base_fingerprint(hooked)  # before the deltas join the state dict
    training = hooked.hf.training
    tuned = precise(hooked, components, kv)
    for delta in tuned.deltas.values():
        _index_out_of_state_dict(delta)
    hooked.hf.train(training)
    handle = PreciseSFT(tuned, fingerprint, rescale)
    if rescale:
        handle._hook_rescale()
    hooked.hf.__dict__[HANDLE] = handle
    return handle


def handle_of(model) -> PreciseSFT:
    """The handle `attach` left on a model (or on the model a DDP/accelerate wrapper holds)."""
    for candidate in (model, getattr(model, "module", None)):
        if isinstance(candidate, PreciseSFT):
            return candidate
        found = getattr(candidate, "__dict__", {}).get(HANDLE)
        if found is not None:
            return found
    raise UserError("this model has no precise SFT attached (keyheads.finetune.attach)")


def save(handle_or_model, out_dir: str | Path, args=None, *, train: dict | None = None,
         data: dict | None = None) -> Path:
    """Write the adapter of an attached model (or of its handle) as `keyheads finetune` does; see PreciseSFT.save."""
    return handle_of(handle_or_model).save(out_dir, args, train=train, data=data)


class PreciseSFTCallback(TrainerCallback):
    """Writes the adapter at the end of training into `out_dir`, and at each trainer checkpoint into
    `output_dir/checkpoint-N`, with the training figures `keyheads eval` shows (samples/s, losses)."""

    def __init__(self, handle: PreciseSFT, out_dir: str | Path, data_name: str = ""):
        self.handle, self.out_dir, self.data_name = handle, Path(out_dir), data_name
        self._t0, self._start, self._data = time.perf_counter(), 0, {"name": data_name}

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self._t0, self._start = time.perf_counter(), state.global_step
        dataset = getattr(train_dataloader, "dataset", None)
        self._data = {"name": self.data_name, "n": len(dataset) if hasattr(dataset, "__len__") else None,
                      "datasets_fingerprint": getattr(dataset, "_fingerprint", None)}
        self.handle.recipe(args)

    def _train(self, args, state) -> dict:
        seconds = time.perf_counter() - self._t0
        steps = state.global_step - self._start
        batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1)
        losses = [row["loss"] for row in state.log_history if "loss" in row]
        return {"steps": state.global_step, "steps_this_run": steps, "samples_this_run": steps * batch,
                "seconds_this_run": round(seconds, 3),
                "samples_per_second": steps * batch / seconds if seconds > 0 else float("nan"),
                "final_loss": losses[-1] if losses else None, "losses": losses,
                "logging_steps": args.logging_steps, "processes": max(args.world_size, 1), "device": str(args.device)}

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        self.handle.save(folder, args, train=self._train(args, state), data=self._data)

    def on_train_end(self, args, state, control, **kwargs):
        self.handle.save(self.out_dir, args, train=self._train(args, state), data=self._data)


__all__ = ["PreciseSFT", "PreciseSFTCallback", "attach", "choose_components", "handle_of", "save",
           "settings_from_args"]

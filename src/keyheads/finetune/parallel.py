"""How the processes of a training run share the work: DDP (accelerate) or FSDP2 (torch's fully_shard).

Both are a `Parallel` (protocol.py): `train` uses the same few members either way:
- DDP: every process holds the whole model; accelerate wraps it and averages the trained gradients.
- FSDP2: every decoder layer and the root are `fully_shard`ed over the processes. Frozen and trained
  parameters alike are split in 1/world shards (DTensors); a layer's whole weights exist only during
  its own forward and backward. Trained tensors, their gradients and the AdamW state stay float32
  shards (the master copy); `compute_dtype` (bf16 on GPUs) is what the layers multiply in, and
  gradients are reduced in float32, so full SFT loses no small update. `offload` keeps the shards,
  gradients and optimizer state in CPU memory (FSDP2's CPUOffloadPolicy) and moves a layer to the GPU
  for its own forward and backward.
"""
from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.distributed as dist
from accelerate import Accelerator, DistributedDataParallelKwargs
from accelerate.utils import broadcast
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import distribute_tensor

from .. import distributed
from ..errors import SettingError
from ..models.loading import place
from ..models.sharded import is_meta, materialize, read_own_shards
from .layer import ATTR, is_conv1d
from .model import Tuned, local, lora_factors, whole
from .protocol import Parallel
from .settings import FinetuneSettings


def make_accelerator(cpu: bool) -> Accelerator:
    """DDP without find_unused_parameters (every delta gets a gradient each step) and without
    re-broadcasting buffers on each forward (the deltas' copies of W0 are buffers, identical everywhere)."""
    return Accelerator(cpu=cpu, kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=False,
                                                                               broadcast_buffers=False)])


class DDP:
    """accelerate's data parallelism: whole model per process, gradients all-reduced."""

    name = "ddp"
    sharded = False

    def __init__(self, accelerator: Accelerator, device: torch.device):
        self.acc = accelerator
        self.device = device
        self.world, self.rank = accelerator.num_processes, accelerator.process_index
        self.is_main = accelerator.is_main_process

    def prepare(self, tuned: Tuned) -> nn.Module:
        return self.acc.prepare(tuned.module)

    def micro_step(self, module: nn.Module, last: bool) -> AbstractContextManager:
        """Gradients are all-reduced on the last micro-batch of a step only."""
        return nullcontext() if last else self.acc.no_sync(module)

    def backward(self, loss: torch.Tensor) -> None:
        self.acc.backward(loss)

    def clip(self, params: list[nn.Parameter], max_norm: float) -> None:
        self.acc.clip_grad_norm_(params, max_norm)

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        return self.acc.reduce(value, "sum")

    def first(self, flag: bool) -> bool:
        """The first process's `flag`, on every process."""
        return bool(broadcast(torch.tensor([float(flag)], device=self.acc.device), from_process=0).item())

    def barrier(self) -> None:
        self.acc.wait_for_everyone()


class FSDP:
    """torch's FSDP2 over every process of the launcher (or a group of one without a launcher)."""

    name = "fsdp"
    sharded = True

    def __init__(self, device: torch.device, compute_dtype: torch.dtype | None = None, offload: bool = False):
        """`offload` on a GPU only: make_parallel checks it (check_offload)."""
        if distributed.launched():
            distributed.world()  # accelerate's PartialState sets up the process group (gloo on CPU, nccl on GPUs)
        elif not dist.is_initialized():
            # One process without a launcher (FSDP2 on one GPU, for its offload): a group of one.
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(),
                                    rank=0, world_size=1)
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.is_main = self.rank == 0
        self.device = device
        self.offload = offload
        # No cast when the compute dtype is already float32 (the CPU default): FSDP then computes in fp32.
        param = None if compute_dtype in (None, torch.float32, torch.float64) else compute_dtype
        self.mp = MixedPrecisionPolicy(param_dtype=param, reduce_dtype=torch.float32)

    def prepare(self, tuned: Tuned) -> nn.Module:
        """Shard every decoder layer, then the root (embeddings, final norm, unembedding, tied or not)."""
        hf = tuned.model.hf
        for _, p in tuned.named_trainable():
            # Trained tensors are float32 masters (FSDP2 also needs one dtype for them): full SFT's weights and
            # precise SFT's MLPs of a bf16 model; the deltas and LoRA's factors are float32 already.
            p.data = p.data.to(torch.promote_types(p.dtype, torch.float32))
        mesh = init_device_mesh(self.device.type, (self.world,))
        policy: OffloadPolicy = CPUOffloadPolicy() if self.offload else OffloadPolicy()
        for layer in tuned.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=self.mp, offload_policy=policy)
        fully_shard(hf, mesh=mesh, mp_policy=self.mp, offload_policy=policy)
        if any(is_meta(p) for p in tuned.module.parameters()):  # loaded without its weights: read them now
            self._read_weights(tuned, mesh)
        for delta in tuned.deltas.values():
            # decay_deltas works shard by shard: keep only this shard's entries of W0, where the shard lives
            shard = distribute_tensor(delta.base.to(self.device), mesh, delta.weight.placements).to_local()
            delta.base = shard.to(local(delta.weight).device)
        return tuned.module

    def _read_weights(self, tuned: Tuned, mesh) -> None:
        """Each process reads its own shards of the model's weights (models.sharded) and makes what training
        adds: zero deltas and their W0 entries, or LoRA's seeded factors."""
        # CPU offload keeps the shards in host memory; FSDP2 moves a layer to the GPU for its own passes
        empty = materialize(tuned.module, torch.device("cpu") if self.offload else self.device)
        added = {name for name in empty if ATTR in name or ".lora_" in name}
        root = next(name for name, m in tuned.module.named_modules() if m is tuned.model.hf)  # PEFT wraps it
        prefix = f"{root}." if root else ""
        read_own_shards(tuned.model.hf, tuned.model.source, {n.removeprefix(prefix) for n in empty - added})
        factors = lora_factors(tuned.module, tuned.seed) if tuned.method == "lora" else {}
        trained = dict(tuned.module.named_parameters())
        with torch.no_grad():
            for name in sorted(added & trained.keys()):
                p = trained[name]
                if name in factors:
                    local(p).copy_(distribute_tensor(factors[name], mesh, p.placements).to_local())
                else:  # a delta's weight or bias: zero at the start
                    local(p).zero_()
            for key, delta in tuned.deltas.items():  # W0's trained entries, one projection gathered at a time
                projection = tuned.projection(key)
                w0 = whole(projection.weight)
                delta.base = delta.entries(w0.T if is_conv1d(projection) else w0).to(delta.weight.dtype)

    def micro_step(self, module: nn.Module, last: bool) -> AbstractContextManager:
        """Gradients are reduce-scattered after every micro-batch: FSDP keeps only the shard of a gradient,
        which is what lets a model train whose whole gradient does not fit one device."""
        return nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip(self, params: list[nn.Parameter], max_norm: float) -> None:
        # The norm of sharded gradients is reduced over the processes by DTensor.
        torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm)

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        value = value.clone()
        dist.all_reduce(value)
        return value

    def first(self, flag: bool) -> bool:
        """The first process's `flag`, on every process."""
        value = torch.tensor([float(flag)], device=self.device)
        dist.broadcast(value, src=0)
        return bool(value.item())

    def barrier(self) -> None:
        dist.barrier()


def setting_name(key: str, section: str | None = None) -> str:
    """A fine-tuning setting as the user gives it: a flag of `keyheads finetune` (section None,
    `--optimizer-batch-size`) or a key of a run config (section "finetune": `finetune.optimizer_batch_size`)."""
    return f"{section}.{key}" if section else "--" + key.replace("_", "-")


def check_batch_split(batch_size: int, world: int, key: str = "--optimizer-batch-size") -> None:
    """The one check that the optimizer batch splits evenly over the processes; `key` names the setting."""
    if batch_size % world:
        raise SettingError(key, batch_size, f"does not split over the {world} processes; use a multiple of {world}, "
                                            f"e.g. {max(world, batch_size // world * world)}")


def check_offload(offload: bool, parallel: str, device: str, section: str | None = None) -> None:
    """The one check of offload: it is FSDP2's, and it moves shards to a GPU (`device`: where the run trains)."""
    if not offload:
        return
    key = setting_name("offload", section)
    if parallel != "fsdp":
        fsdp = "--parallel fsdp" if section is None else f"{section}.parallel: fsdp"
        raise SettingError(key, offload, f"is FSDP2's CPU offload: add {fsdp}")
    if not device.startswith("cuda"):
        raise SettingError(key, offload, f"moves shards between GPU and CPU memory, so it needs a GPU, and this run "
                                         f"is on {device}: leave it out")


def check_setup(cfg: FinetuneSettings, device: str | None, world: int, section: str | None = None) -> None:
    """What can be refused before any model loads; `section` names the settings as a run config does
    ("finetune": finetune.optimizer_batch_size), None as `keyheads finetune`'s flags."""
    check_batch_split(cfg.optimizer_batch_size, world, setting_name("optimizer_batch_size", section))
    if device == "auto" and (cfg.parallel == "fsdp" or world > 1):
        raise SettingError("--device auto splits one model over the devices of one process, and accelerate does not "
                           "train such a model on several processes or under FSDP: leave --device out (each process "
                           "takes its own GPU) and use --parallel fsdp to spread the model over the processes")
    if os.getenv("ACCELERATE_USE_FSDP", "").lower() in ("1", "true", "yes") and cfg.parallel != "fsdp":
        # accelerate's own FSDP wrapping would meet keyheads' DDP set-up: one way to shard, ours
        raise SettingError("`accelerate launch --use_fsdp` is not how keyheads shards: launch without --use_fsdp "
                           "and add --parallel fsdp (FSDP2, set up by keyheads)")
    check_offload(cfg.offload, cfg.parallel, place(device, sharded=cfg.parallel == "fsdp").run_on, section)


def make_parallel(mode: str, device: torch.device, compute_dtype: torch.dtype | None = None, offload: bool = False,
                  accelerator: Accelerator | None = None) -> Parallel:
    check_offload(offload, mode, str(device))
    if mode == "fsdp":
        if accelerator is not None:
            raise ValueError("an Accelerator is for DDP; FSDP2 runs on torch's process group")
        return FSDP(device, compute_dtype, offload)
    return DDP(accelerator or make_accelerator(device.type == "cpu"), device)

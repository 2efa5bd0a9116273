"""For each stage and method: the bytes per GPU in each parallel mode, whether they fit, and the flags.

Training modes, tried in this order (the first that fits is chosen): DDP (every process holds the whole
model), FSDP2 (everything sharded over the processes), FSDP2 with CPU offload (the shards, their
gradients and AdamW state on the host; the GPU holds the layers being computed and the activations).
The micro-batch is halved from the one asked for until the GPU holds it. Analyses: one GPU, or the model
split over the node's GPUs with accelerate's device_map="auto", or split with CPU offload.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import costs
from .costs import ADAMW_STATE, ADAMW_STEP, DDP_BUCKETS, DELTA_BASE, FP32, TRAINED_GRAD, TRAINED_WEIGHT, GiB
from .shape import ModelShape

TRAINING_VARIANTS = ("precise", "precise+mlp", "lora", "full")  # the fine-tuning runs a plan covers
ANALYSES = ("identify", "identify attribution", "knockout", "attention", "mlp", "eval/generate")


@dataclass(frozen=True)
class Machine:
    gpus: int                # per node
    nodes: int
    gpu_bytes: int
    host_bytes: int | None   # per node; None: not checked

    @property
    def world(self) -> int:
        return self.gpus * self.nodes


@dataclass(frozen=True)
class Workload:
    seq_len: int = 512
    micro_batch: int = 8     # training samples per forward pass and process
    batch: int = 16          # analysis prompts per forward pass
    prompt_len: int = 256    # analysis tokens a prompt (eval: prompt and generated tokens)
    heads: int = 32          # precise SFT's heads
    mlps: int = 3            # precise + MLPs' whole MLP layers
    lora_rank: int = 8
    dtype: str = "bfloat16"  # compute dtype of the frozen weights and activations


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU (and per node on the host) of one stage in one mode."""

    frozen: int = 0       # frozen weights (compute dtype)
    trained: int = 0      # fp32 trained weights
    working: int = 0      # their compute-dtype copies kept for the backward pass
    buffers: int = 0      # precise SFT's fp32 copies of W0's trained entries
    grads: int = 0        # fp32 gradients (and DDP's buckets)
    optimizer: int = 0    # AdamW state
    gathered: int = 0     # FSDP2's unsharded layers and gradients
    activations: int = 0
    step: int = 0         # AdamW's temporaries during the optimizer step, when activations and gathered are freed
    host: int = 0         # per node: what offload puts in host memory

    @property
    def gpu(self) -> int:
        held = self.frozen + self.trained + self.working + self.buffers + self.grads + self.optimizer
        return held + max(self.gathered + self.activations, self.step)


@dataclass(frozen=True)
class Option:
    mode: str             # ddp, fsdp, fsdp+offload; gpu, auto, auto+cpu
    fits: bool
    memory: Memory
    micro_batch: int = 0
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class StagePlan:
    stage: str            # "finetune precise", ..., or an analysis
    trained_params: int
    options: tuple[Option, ...]

    @property
    def chosen(self) -> Option | None:
        return next((o for o in self.options if o.fits), None)


@dataclass(frozen=True)
class Plan:
    shape: ModelShape
    machine: Machine
    workload: Workload
    usable_per_gpu: int
    stages: tuple[StagePlan, ...] = field(default=())


def trained_params(shape: ModelShape, method: str, w: Workload) -> int:
    if method == "full":
        return shape.params
    if method == "lora":
        return shape.lora_params * w.lora_rank
    mlps = min(w.mlps, shape.n_layers) * shape.mlp_params if method == "precise+mlp" else 0
    return shape.precise_params(w.heads) + mlps


def _train_memory(shape: ModelShape, method: str, w: Workload, mode: str, world: int, gpus: int,
                  micro: int) -> Memory:
    b = costs.DTYPE_BYTES[w.dtype]
    t = trained_params(shape, method, w)
    deltas = shape.precise_params(w.heads) if method.startswith("precise") else 0
    # a delta sits beside W0's slice, which stays in the frozen base; LoRA's A and B are new tensors too
    frozen = 0 if method == "full" else shape.params if method == "lora" else shape.params - (t - deltas)
    kind = "precise" if method.startswith("precise") else method
    mlps = w.mlps if method == "precise+mlp" else 0
    per_token = costs.saved_train(shape, b, w.seq_len, micro, kind, w.heads, mlps, w.lora_rank)
    per_token += costs.transient_train(shape, b)
    activations = per_token * micro * w.seq_len
    states = (TRAINED_WEIGHT * t, TRAINED_GRAD * t, ADAMW_STATE * t)
    step = ADAMW_STEP * max(deltas, t - deltas)  # one param group at a time: the deltas apart from whole weights
    if mode == "ddp":
        buckets = DDP_BUCKETS * t if world > 1 else 0
        return Memory(frozen=b * frozen, trained=states[0], working=b * t, buffers=DELTA_BASE * deltas,
                      grads=states[1] + buckets, optimizer=states[2], activations=activations, step=step)
    trained_layer = t // shape.n_layers if method != "full" else shape.layer_params
    gathered: float = b * (shape.root_params + costs.FSDP_GATHERED_LAYERS * shape.layer_params)
    gathered += costs.FSDP_GRAD_LAYERS * FP32 * trained_layer
    shards = (b * frozen / world, states[0] / world, states[1] / world, states[2] / world)
    if mode == "fsdp":
        return Memory(frozen=int(shards[0]), trained=int(shards[1]), buffers=DELTA_BASE * deltas,
                      grads=int(shards[2]), optimizer=int(shards[3]), gathered=int(gathered), activations=activations,
                      step=step // world)
    return Memory(buffers=DELTA_BASE * deltas, gathered=int(gathered), activations=activations,
                  host=int(sum(shards) * gpus))


def _train_flags(mode: str, micro: int) -> tuple[str, ...]:
    parallel = "ddp" if mode == "ddp" else "fsdp"
    flags: tuple[str, ...] = (f"--finetune.parallel {parallel}",)
    if mode == "fsdp+offload":
        flags += ("--finetune.offload",)
    return flags + (f"--finetune.micro-batch-size {micro}",)


def _fits(mem: Memory, machine: Machine, usable: int) -> bool:
    host_ok = machine.host_bytes is None or mem.host <= machine.host_bytes
    return mem.gpu <= usable and host_ok


def plan_training(shape: ModelShape, method: str, machine: Machine, w: Workload, usable: int) -> StagePlan:
    options = []
    for mode in ("ddp", "fsdp", "fsdp+offload"):
        micro = w.micro_batch
        mem = _train_memory(shape, method, w, mode, machine.world, machine.gpus, micro)
        while mem.gpu > usable and micro > 1:  # a smaller micro-batch needs no less host memory
            micro //= 2
            mem = _train_memory(shape, method, w, mode, machine.world, machine.gpus, micro)
        options.append(Option(mode, _fits(mem, machine, usable), mem, micro, _train_flags(mode, micro)))
    return StagePlan(f"finetune {method}", trained_params(shape, method, w), tuple(options))


def analysis_activations(shape: ModelShape, analysis: str, w: Workload, batch: int) -> int:
    """Bytes a forward pass of `batch` prompts of `w.prompt_len` tokens needs besides the weights."""
    b = costs.DTYPE_BYTES[w.dtype]
    per_token = costs.infer_token(shape, b)
    if analysis == "identify":  # activation patching keeps the prefix's K/V cache and a copy per sender
        per_token += 2 * costs.kv_cache_token(shape, b)
    elif analysis == "identify attribution":  # one backward pass with every weight frozen
        per_token = costs.saved_train(shape, b, w.prompt_len, batch, "precise") + costs.transient_train(shape, b)
    elif analysis == "attention":
        per_token += costs.eager_scores_token(shape, b, w.prompt_len)
    elif analysis == "eval/generate":
        per_token += costs.kv_cache_token(shape, b)
    return per_token * batch * w.prompt_len


def _analysis_option(shape: ModelShape, analysis: str, machine: Machine, w: Workload, usable: int, mode: str,
                     batch: int) -> Option:
    b = costs.DTYPE_BYTES[w.dtype]
    weights = b * shape.params
    act = analysis_activations(shape, analysis, w, batch)
    room = max(usable - act, 0)  # what each GPU may give the weights: accelerate's max_memory
    n = machine.gpus
    limits = ",".join(f"{k}={room // GiB}GiB" for k in range(n))
    if mode == "gpu":
        mem = Memory(frozen=weights, activations=act)
        return Option(mode, mem.gpu <= usable, mem, batch, ("--device cuda", f"--batch-size {batch}"))
    if mode == "auto":
        mem = Memory(frozen=-(-weights // n), activations=act)
        return Option(mode, n > 1 and mem.gpu <= usable, mem, batch,
                      ("--device auto", f"--max-memory {limits}", f"--batch-size {batch}"))
    rest = max(weights - room * n, 0)  # auto+cpu: what the GPUs cannot hold waits on the host
    mem = Memory(frozen=min(weights, room * n) // n, activations=act, host=rest)
    host_ok = machine.host_bytes is None or rest <= machine.host_bytes
    fits = room >= b * shape.layer_params and host_ok  # a layer computes on a GPU, brought in by accelerate
    return Option(mode, fits, mem, batch,
                  ("--device auto", f"--max-memory {limits},cpu={-(-rest // GiB)}GiB", f"--batch-size {batch}"))


def plan_analysis(shape: ModelShape, analysis: str, machine: Machine, w: Workload, usable: int) -> StagePlan:
    """One GPU; else the node's GPUs (device_map="auto"); else those GPUs and the host. The batch is halved
    from the one asked for until the mode fits."""
    options = []
    for mode in ("gpu", "auto", "auto+cpu"):
        batch = w.batch
        option = _analysis_option(shape, analysis, machine, w, usable, mode, batch)
        while not option.fits and batch > 1:
            batch //= 2
            option = _analysis_option(shape, analysis, machine, w, usable, mode, batch)
        options.append(option)
    return StagePlan(analysis, 0, tuple(options))


def make_plan(shape: ModelShape, machine: Machine, w: Workload = Workload()) -> Plan:
    usable = costs.usable(machine.gpu_bytes)
    stages = [plan_training(shape, m, machine, w, usable) for m in TRAINING_VARIANTS]
    stages += [plan_analysis(shape, a, machine, w, usable) for a in ANALYSES]
    return Plan(shape, machine, w, usable, tuple(stages))

"""The training loop: AdamW with warm-up and linear decay, gradient accumulation, clipping, the H/h
rescale, atomic checkpoints and resume, on one process or many (DDP or FSDP2, see parallel.py).

The data order is a function of the seed and the step alone: step s takes positions
[s*B, (s+1)*B) of a stream of seeded per-epoch permutations, and process r of W takes every W-th
sample of that global batch. So a resumed run sees exactly the samples it would have seen, and
any number of processes computes the same global-batch gradient. The loss is the sum of token
losses over the completions of the global batch divided by their count, whatever the split.
"""
from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..errors import MissingPackage
from .checkpoint import load_checkpoint, save_checkpoint
from .data import Tokenized, collate, n_loss_tokens
from .model import Tuned
from .parallel import DDP, check_batch_split, make_accelerator
from .protocol import Parallel
from .settings import FinetuneSettings


def total_steps(cfg: FinetuneSettings, n_examples: int) -> int:
    steps = math.ceil(cfg.epochs * n_examples / cfg.optimizer_batch_size)
    return min(steps, cfg.max_steps) if cfg.max_steps else steps


def batch_indices(step: int, n: int, batch_size: int, seed: int) -> list[int]:
    """The global batch of `step`: positions of a stream of seeded per-epoch permutations."""
    out: list[int] = []
    pos = step * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(pos, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
        take = min(batch_size - len(out), n - offset)
        out += perm[offset:offset + take].tolist()
        pos += take
    return out


def completion_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of every completion token given the tokens before it.

    Only the rows that carry a label go through the softmax: the prompt's rows (most of a math
    sample) would cost a vocabulary-wide copy and gradient each for nothing.
    """
    target = labels[:, 1:]
    keep = target != -100
    picked = logits[:, :-1][keep]
    return F.cross_entropy(picked.to(torch.promote_types(logits.dtype, torch.float32)), target[keep], reduction="sum")


@dataclass
class TrainResult:
    steps: int
    samples: int
    seconds: float
    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")


def make_optimizer(tuned: Tuned, cfg: FinetuneSettings) -> torch.optim.Optimizer:
    groups = tuned.param_groups(cfg.weight_decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr)
    if cfg.optimizer == "adamw8bit":
        try:
            import bitsandbytes
        except ImportError:
            raise MissingPackage("--optimizer adamw8bit needs bitsandbytes: pip install bitsandbytes==0.50.2 "
                                 "(or keyheads[finetune])") from None
        # Tensors under 4096 entries (biases, norms, small deltas) keep fp32 moments, as bitsandbytes decides.
        return _lean_adamw8bit(bitsandbytes)(largest_last(groups), lr=cfg.lr, betas=cfg.adam_betas,
                                             eps=cfg.adam_eps)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps)


def largest_last(groups: list[dict]) -> list[dict]:
    """The same groups, each tensor list by size and the group of the largest tensor last, so that the
    optimizer updates the largest tensor (a 152k-row embedding) when the other gradients are gone."""
    groups = [{**g, "params": sorted(g["params"], key=torch.Tensor.numel)} for g in groups]
    return sorted(groups, key=lambda g: g["params"][-1].numel())


def _lean_adamw8bit(bitsandbytes):
    class LeanAdamW8bit(bitsandbytes.optim.AdamW8bit):
        """bitsandbytes' AdamW8bit that frees each gradient once its tensor is updated.

        Its CPU kernel dequantises both moments of a tensor to fp32 and copies the gradient and the
        denominator: about five fp32 copies of the tensor at once, 4.7 GB for Qwen2.5-1.5B's embedding,
        on top of every other gradient. Updated last (largest_last), it finds those gradients freed.
        Each tensor's update is the library's own, so the weights are bit-identical to AdamW8bit's.
        """

        def update_step(self, group, p, gindex, pindex):
            super().update_step(group, p, gindex, pindex)
            p.grad = None

    return LeanAdamW8bit


def make_scheduler(optimizer, cfg: FinetuneSettings, steps: int):
    # imported here: transformers' optimization module imports its Trainer's utilities, and with them peft and
    # bitsandbytes, about 1.5 s at the start of every command, which most commands never train in
    from transformers import get_linear_schedule_with_warmup  # noqa: PLC0415

    return get_linear_schedule_with_warmup(optimizer, math.ceil(cfg.warmup_ratio * steps), steps)


def _checkpoint_due(cfg: FinetuneSettings, done: int, since_save: float, par: Parallel) -> bool:
    if cfg.save_every and done % cfg.save_every == 0:
        return True
    if not cfg.save_minutes:
        return False
    # Clocks differ between processes, and a save is collective: every process takes the first one's word.
    return par.first(since_save >= 60 * cfg.save_minutes)


@contextmanager
def signals_after_the_update() -> Iterator[None]:
    """Ctrl-C or SIGTERM that arrives during an optimizer update is delivered once the update has finished.

    A half-updated state cannot be saved, so an interrupt inside the update used to fall back to the last
    periodic checkpoint and lose every step since. Held back until here, the signal meets its own handler
    (Ctrl-C's KeyboardInterrupt, the CLI's SIGTERM-as-Ctrl-C, or the default) with the step complete.
    Signal handlers can only be set from the main thread; elsewhere nothing is held back.
    """
    watched = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in watched}
    if threading.current_thread() is not threading.main_thread() or None in previous.values():
        yield
        return
    caught: list[int] = []
    for s in watched:
        signal.signal(s, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if caught:
        signal.raise_signal(caught[0])


def train(tuned: Tuned, data: list[Tokenized], cfg: FinetuneSettings, out: str | Path, meta: dict,
          parallel: Parallel | None = None, progress: bool = True) -> TrainResult:
    """Train `tuned` on `data`; checkpoints into `out`/checkpoint and resumes from it.

    `meta` (base fingerprint, components, data hash, ...) is stored with every checkpoint; a resume
    whose settings or meta differ is refused, naming the keys that differ.
    """
    if not data:
        raise ValueError("no training examples")
    par = parallel or DDP(make_accelerator(tuned.model.device.type == "cpu"), tuned.model.device)
    world, rank = par.world, par.rank
    check_batch_split(cfg.optimizer_batch_size, world)
    out = Path(out)
    steps = total_steps(cfg, len(data))
    device = par.device
    module = par.prepare(tuned)
    optimizer = make_optimizer(tuned, cfg)  # after prepare: FSDP2 replaces the parameters with their shards
    scheduler = make_scheduler(optimizer, cfg, steps)
    params = [p for p in module.parameters() if p.requires_grad]
    record = {"config": cfg.to_json(), **meta, "total_steps": steps}
    if cfg.optimizer == "adamw8bit":  # its states are stored by position, and largest_last set the order
        record["optimizer_order"] = "largest last"

    start, losses = load_checkpoint(out / "checkpoint", record, tuned, optimizer, scheduler)
    pad = tuned.model.tokenizer.pad_token_id
    module.train()
    bar = tqdm(total=steps, initial=start, desc=f"{cfg.method} SFT", disable=not (progress and par.is_main),
               unit="step")
    seconds, samples, step_seconds, updating = 0.0, 0, [], False
    last_save = time.monotonic()
    try:
        for step in range(start, steps):
            t0 = time.perf_counter()
            batch = [data[i] for i in batch_indices(step, len(data), cfg.optimizer_batch_size, cfg.seed)]
            tokens = n_loss_tokens(batch)
            mine = batch[rank::world]
            micro = [mine[i:i + cfg.micro_batch_size] for i in range(0, len(mine), cfg.micro_batch_size)]
            # read once per step: no sync per micro-batch
            step_loss = torch.zeros((), dtype=torch.float64, device=device)
            for j, items in enumerate(micro):
                inputs = collate(items, pad, device)
                labels = inputs.pop("labels")
                with par.micro_step(module, last=j == len(micro) - 1):
                    # No name holds the logits, so they are freed as soon as the loss no longer needs them.
                    loss_sum = completion_loss_sum(module(**inputs, use_cache=False).logits, labels)
                    # DDP and FSDP average over processes; the sum over processes is what we want.
                    par.backward(loss_sum * (world / tokens))
                step_loss += loss_sum.detach().double()
            if cfg.rescale and tuned.method == "precise":
                tuned.rescale_grads()
            if cfg.max_grad_norm > 0:
                par.clip(params, cfg.max_grad_norm)
            with signals_after_the_update():
                updating = True  # an exception from here to the step's end leaves no consistent state to save
                lr = scheduler.get_last_lr()[0]
                tuned.decay_deltas(lr, cfg.weight_decay)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step_seconds.append(time.perf_counter() - t0)
                seconds += step_seconds[-1]
                samples += len(batch)
                losses.append(float(par.sum(step_loss).item()) / tokens)
                updating = False
            bar.set_postfix(loss=f"{losses[-1]:.4f}", samples_s=f"{samples / seconds:.1f}")
            bar.update(1)
            if step + 1 < steps and _checkpoint_due(cfg, step + 1, time.monotonic() - last_save, par):
                save_checkpoint(out / "checkpoint", record, step + 1, losses, tuned, optimizer, scheduler, par)
                last_save = time.monotonic()
    except KeyboardInterrupt:
        # Keep every finished step. With several processes the others may not be here to agree,
        # so only a single process saves; they resume from the last periodic checkpoint.
        done = len(losses)  # steps finished, this run and before
        if world == 1 and done > start and not updating:
            save_checkpoint(out / "checkpoint", record, done, losses, tuned, optimizer, scheduler, par)
        raise
    finally:
        bar.close()
    module.eval()
    return TrainResult(steps - start, samples, seconds, losses, step_seconds)

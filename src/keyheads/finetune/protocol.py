"""`Parallel`: what a way of sharing a training run over processes gives the code that trains.

keyheads.finetune.parallel has two, DDP (accelerate's data parallelism: the whole model in every process)
and FSDP (torch's FSDP2: every parameter sharded over the processes). The training loop (train.py), the
checkpoints (checkpoint.py) and `finetune` (run.py) use only these members, so none of them asks which
of the two it was given.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

import torch
from torch import nn

from .model import Tuned


class Parallel(Protocol):
    name: str              # the --parallel value ("ddp", "fsdp"), as finetune.json records it
    sharded: bool          # the parameters are split over the processes: saving the state is a collective
    world: int             # processes in the run
    rank: int              # this process's index
    is_main: bool          # the process that writes files and shows progress
    device: torch.device   # where this process computes: its batches go there

    def prepare(self, tuned: Tuned) -> nn.Module:
        """Wrap or shard the trained model; returns the module to call and to take the parameters of."""
        ...

    def micro_step(self, module: nn.Module, last: bool) -> AbstractContextManager:
        """The context of one micro-batch's forward and backward (`last`: the step's last micro-batch)."""
        ...

    def backward(self, loss: torch.Tensor) -> None:
        ...

    def clip(self, params: list[nn.Parameter], max_norm: float) -> None:
        """Clip the gradients to a global norm of `max_norm`, over every process."""
        ...

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """`value` summed over the processes (on every process)."""
        ...

    def first(self, flag: bool) -> bool:
        """The first process's `flag`, on every process."""
        ...

    def barrier(self) -> None:
        """Wait until every process is here."""
        ...

"""Several processes (started by `accelerate launch` or `torchrun`): who am I, my share, gathering back,
and work that the main process alone does while the others wait (`on_main`).

A plain single process initialises nothing: it is rank 0 of 1, `shard` gives it everything and
`gather` returns what it was given. Under a launcher, accelerate's `PartialState` sets up the
process group (gloo on CPU, nccl on GPUs) the first time any function here is called.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import cache
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from accelerate import PartialState

from .errors import UserError

T = TypeVar("T")
M = TypeVar("M")
R = TypeVar("R")

# Launchers set one of these to the number of processes (torchrun/accelerate: WORLD_SIZE; MPI: the others).
_SIZE_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
# A rank that finishes its share early waits in a collective for the slowest one; after a resume the
# shares can differ by hours, which the default 30-minute timeout would turn into a crash. A rank
# that dies still ends the job at once: the launcher stops the others.
TIMEOUT = timedelta(hours=24)


def launched() -> bool:
    """Whether this process is one of several started by a launcher."""
    return any(int(os.getenv(v) or 1) > 1 for v in _SIZE_VARS)


@cache
def _state():
    if not launched():
        return None
    # Without cpu=True, accelerate sees no GPU and quietly falls back to a single process.
    cpu = os.getenv("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes") or not torch.cuda.is_available()
    return PartialState(cpu=cpu, timeout=TIMEOUT)


def rank() -> int:
    state = _state()
    return 0 if state is None else state.process_index


def world() -> int:
    state = _state()
    return 1 if state is None else state.num_processes


def is_main() -> bool:
    return rank() == 0


def default_device() -> str | None:
    """This process's own device under a launcher (cuda:LOCAL_RANK or cpu); None in a plain process."""
    state = _state()
    if state is None:
        return None
    return "cpu" if state.device.type == "cpu" else str(state.device)  # "cpu:0" would not read as CPU elsewhere


def barrier() -> None:
    if world() > 1:
        _state().wait_for_everyone()


def shard(n: int) -> list[int]:
    """This rank's indices of range(n): every world()-th from rank() on.

    Strided rather than contiguous so that lists whose items grow in cost along the list
    (longer prompts, more heads knocked out) still give every rank a similar load.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"shard(n) needs a non-negative int, got {n!r}")
    return list(range(rank(), n, world()))


def gather(obj: Any) -> list:
    """Every rank's `obj` (anything picklable: numpy arrays, dicts, ...), in rank order, on every rank."""
    if world() == 1:
        return [obj]
    out: list = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def map_sharded(fn: Callable[[list[T]], Sequence[R]], items: Sequence[T]) -> list[R]:
    """fn over this rank's share of `items` (see `shard`); -> every result, in item order, on every rank.

    `fn` takes a sub-list and returns one result per item, in order; it is not called for an
    empty share. An exception in `fn` on any rank is raised on every rank (the failing one
    re-raises its own), so that no rank waits forever for a share that will never come.
    """
    items = list(items)
    if world() == 1:
        return _checked(fn, items)
    mine = shard(len(items))
    try:
        part, error = (_checked(fn, [items[i] for i in mine]) if mine else []), None
    except Exception as err:  # noqa: BLE001 - sent to the other ranks, then re-raised
        part, error = None, err
    shares = gather((mine, part, None if error is None else f"{type(error).__name__}: {error}"))
    if error is not None:
        raise error
    failed = [(r, msg) for r, (_, _, msg) in enumerate(shares) if msg is not None]
    if failed:
        raise RuntimeError("; ".join(f"rank {r} of {world()} failed: {msg}" for r, msg in failed))
    out: list = [None] * len(items)
    for indices, results, _ in shares:
        for i, result in zip(indices, results):
            out[i] = result
    return out


def _checked(fn: Callable[[list[T]], Sequence[R]], sub: list[T]) -> list[R]:
    results = list(fn(sub))
    if len(results) != len(sub):
        raise ValueError(f"map_sharded: fn returned {len(results)} results for {len(sub)} items")
    return results


class MainProcessFailed(UserError):
    """Raised on the other processes when work done by the main process alone failed there.

    The main process reports its own error (a bad input's one line, or a bug's traceback); the
    others stop with this one line instead of waiting for results that will not come.
    """


def broadcast(obj: Any) -> Any:
    """The main process's `obj` (anything picklable), on every rank."""
    if world() == 1:
        return obj
    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


_steps = [0]  # calls of on_main in this process: every process makes the same calls in the same order


def on_main(fn: Callable[[], M], what: str = "") -> M:
    """fn() on the main process alone while the others wait; -> its result, on every rank.

    An exception in `fn` is re-raised on the main process and reaches the others as
    MainProcessFailed (naming `what`), so that none waits forever for the main one.
    """
    if world() == 1:
        return fn()
    _steps[0] += 1
    result, error = None, None
    if is_main():
        try:
            result = fn()
        except BaseException as err:  # noqa: BLE001 - sent to the other ranks, then re-raised
            error = err
    step, sent, failure = broadcast((_steps[0], result, None) if error is None
                                    else (_steps[0], None, f"{type(error).__name__}: {error}"))
    if error is not None:
        raise error
    if step != _steps[0]:  # a result meant for another call must not be taken for this one's
        raise RuntimeError(f"process {rank()} is out of step with the main process (call {_steps[0]} of on_main "
                           f"here, {step} there{', at ' + what if what else ''})")
    if failure is not None:
        raise MainProcessFailed(f"the main process failed{' in ' + what if what else ''} ({failure}); "
                                "this process stops too: see the main process's message")
    return sent

"""Checkpoints of a training run: trainable tensors, optimizer, scheduler, RNG states and the step.

A checkpoint folder is written under a temporary name and renamed into place, so a run killed
while saving keeps the previous checkpoint. Resuming compares the stored record (settings, base
model fingerprint, components, data hash) with the new run's and refuses when they differ.

Under DDP every process holds the same state and the main process writes it (safetensors + torch).
Under FSDP2 each process writes its own shards of the trained tensors and of the optimizer state with
torch.distributed.checkpoint into `shards/` (a folder every process must see), and the main process
adds the rest. DCP re-shards on load, so such a checkpoint resumes on any number of processes.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from ..errors import ResumeMismatch
from ..io import atomic_folder, read_json, restore_set_aside, write_json
from ..log import logger
from ..provenance import changed_settings, flatten
from .protocol import Parallel
from .settings import FinetuneSettings


def differing_keys(old: dict, new: dict) -> list[str]:
    """Keys whose values differ, except settings that do not change what is computed."""
    skip = [f"config.{k}" for k in FinetuneSettings.RESUMABLE_CHANGES]
    return [key for key, _, _ in changed_settings(old, new, skip)]


def describe_differences(old: dict, new: dict, keys: list[str], what: str) -> str:
    a, b = flatten(old), flatten(new)
    return "; ".join(f"{k}: {what} {a.get(k)!r}, now {b.get(k)!r}" for k in keys[:8])


def _rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


SHARDS = "shards"
# Only what trains: the frozen base is the model's own, and a 70B base must not be copied per checkpoint.
_TRAINED = StateDictOptions(ignore_frozen_params=True)
# Loading that subset back: the frozen keys are absent on purpose (dcp.load has already refused a
# checkpoint that lacks any trained key).
_INTO_TRAINED = StateDictOptions(ignore_frozen_params=True, strict=False)


def _sharded_state(tuned, optimizer) -> dict:
    model, optim = get_state_dict(tuned.module, optimizer, options=_TRAINED)
    return {"model": model, "optim": optim}


def _share(path: Path | None) -> Path:
    """The main process's temporary folder, on every process."""
    box = [str(path) if path is not None else ""]
    dist.broadcast_object_list(box, src=0)
    return Path(box[0])


def save_checkpoint(folder: Path, record: dict, step: int, losses: list[float], tuned, optimizer, scheduler,
                    parallel: Parallel) -> None:
    """Write the checkpoint of `step` (every process calls this; see the module doc for who writes what)."""
    parallel.barrier()
    state = _sharded_state(tuned, optimizer) if parallel.sharded else None
    if parallel.is_main:
        with atomic_folder(folder, replace=True) as tmp:
            if state is not None:
                dcp.save(state, checkpoint_id=_share(tmp) / SHARDS)
            else:
                save_file({n: p.detach().contiguous().cpu() for n, p in tuned.named_trainable()},
                          str(tmp / "trainable.safetensors"))
            extra = {} if state is not None else {"optimizer": optimizer.state_dict()}
            torch.save({**extra, "scheduler": scheduler.state_dict(), "rng": _rng_state()}, tmp / "state.pt")
            write_json(tmp / "record.json", {**record, "step": step, "losses": losses, "processes": parallel.world})
        # Temporaries of earlier saves killed hard (no cleanup ran): only this process writes here.
        for stale in folder.parent.glob(f".{folder.name}.*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
    elif state is not None:
        dcp.save(state, checkpoint_id=_share(None) / SHARDS)
    parallel.barrier()


def load_checkpoint(folder: Path, record: dict, tuned, optimizer, scheduler) -> tuple[int, list[float]]:
    """Restore a checkpoint into the live objects; -> (step to continue from, losses so far)."""
    restore_set_aside(folder)  # killed between the two renames of a save
    if not (folder / "record.json").is_file():
        return 0, []
    stored = read_json(folder / "record.json")
    if isinstance(stored.get("config"), dict):  # read as settings: an older release's record compares by meaning
        stored = {**stored, "config": FinetuneSettings.from_json(stored["config"]).to_json()}
    differ = differing_keys({k: v for k, v in stored.items() if k not in ("step", "losses", "processes")}, record)
    if differ:
        detail = describe_differences(stored, record, differ, "checkpoint")
        raise ResumeMismatch(f"{folder} was written with other settings ({detail}). Use the same settings to "
                             "resume, or another --out (or delete the checkpoint) to start over")
    state = torch.load(folder / "state.pt", weights_only=False)
    if (folder / SHARDS).is_dir():
        sharded = _sharded_state(tuned, optimizer)
        dcp.load(sharded, checkpoint_id=folder / SHARDS)  # re-shards when the process count changed
        set_state_dict(tuned.module, optimizer, model_state_dict=sharded["model"],
                       optim_state_dict=sharded["optim"], options=_INTO_TRAINED)
    else:
        tensors = load_file(str(folder / "trainable.safetensors"))
        named = dict(tuned.named_trainable())
        if set(tensors) != set(named):
            raise ResumeMismatch(f"{folder} holds other trainable tensors than this run trains")
        with torch.no_grad():
            for name, p in named.items():
                p.copy_(tensors[name])
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    _set_rng_state(state["rng"])
    logger.info("resuming from %s at step %s", folder, stored["step"])
    return int(stored["step"]), list(stored["losses"])

"""Checkpoints of a training run: trainable tensors, optimizer, scheduler, RNG states and the step.

A checkpoint folder is written under a temporary name and renamed into place, so a run killed
while saving keeps the previous checkpoint. Resuming compares the stored record (settings, base
model fingerprint, components, data hash) with the new run's and refuses when they differ.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..errors import ResumeMismatch
from ..io import atomic_folder, read_json, restore_set_aside, write_json
from ..log import logger
from ..provenance import changed_settings, flatten
from .config import FinetuneConfig


def differing_keys(old: dict, new: dict) -> list[str]:
    """Keys whose values differ, except settings that do not change what is computed."""
    skip = [f"config.{k}" for k in FinetuneConfig.RESUMABLE_CHANGES]
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


def save_checkpoint(folder: Path, record: dict, step: int, losses: list[float], tuned, optimizer, scheduler,
                    accelerator) -> None:
    """Write the checkpoint of `step` (main process only; every process holds the same state)."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with atomic_folder(folder, replace=True) as tmp:
            save_file(
                {n: p.detach().contiguous().cpu() for n, p in tuned.named_trainable()},
                str(tmp / "trainable.safetensors"),
            )
            torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": _rng_state()},
                       tmp / "state.pt")
            write_json(tmp / "record.json", {**record, "step": step, "losses": losses})
        # Temporaries of earlier saves killed hard (no cleanup ran): only this process writes here.
        for stale in folder.parent.glob(f".{folder.name}.*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()


def load_checkpoint(folder: Path, record: dict, tuned, optimizer, scheduler) -> tuple[int, list[float]]:
    """Restore a checkpoint into the live objects; -> (step to continue from, losses so far)."""
    restore_set_aside(folder)  # killed between the two renames of a save
    if not (folder / "record.json").is_file():
        return 0, []
    stored = read_json(folder / "record.json")
    differ = differing_keys({k: v for k, v in stored.items() if k not in ("step", "losses")}, record)
    if differ:
        detail = describe_differences(stored, record, differ, "checkpoint")
        raise ResumeMismatch(f"{folder} was written with other settings ({detail}). Use the same settings to "
                             "resume, or another --out (or delete the checkpoint) to start over")
    tensors = load_file(str(folder / "trainable.safetensors"))
    named = dict(tuned.named_trainable())
    if set(tensors) != set(named):
        raise ResumeMismatch(f"{folder} holds other trainable tensors than this run trains")
    with torch.no_grad():
        for name, p in named.items():
            p.copy_(tensors[name])
    state = torch.load(folder / "state.pt", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    _set_rng_state(state["rng"])
    logger.info("resuming from %s at step %s", folder, stored["step"])
    return int(stored["step"]), list(stored["losses"])

"""One fine-tuning run into one folder: train, then write the adapter (or model) and finetune.json."""
from __future__ import annotations

import time
import warnings
from pathlib import Path

import torch

from ..components import Components
from ..io import read_json, write_json
from ..models.fingerprint import base_fingerprint
from ..models.model import HookedModel
from ..provenance import versions
from .adapter import INFO, save_adapter
from .checkpoint import ResumeMismatch, describe_differences, differing_keys
from .config import FinetuneConfig
from .data import Example, examples_sha256, tokenize
from .model import make_trainable
from .train import make_accelerator, train


def finetune(model: HookedModel, examples: list[Example], cfg: FinetuneConfig, out: str | Path,
             components: Components | None = None, data_name: str = "", accelerator=None,
             progress: bool = True) -> dict:
    """Train `model` (modified in place) and write `out`; returns the finetune.json record.

    A finished folder with the same settings is returned as it is; an interrupted one resumes.
    """
    out = Path(out)
    if cfg.method != "precise":
        components = None
    elif components is None:
        raise ValueError("precise SFT needs components (heads and/or MLP layers)")
    meta = {"base_model": model.name, "base_fingerprint": base_fingerprint(model), "method": cfg.method,
            "components": components.to_json() if components else None,
            "data": {"name": data_name, "sha256": examples_sha256(examples), "n": len(examples)}}
    if (out / INFO).is_file():
        done = read_json(out / INFO)
        before = {"config": done.get("config", {}), **{k: done.get(k) for k in meta}}
        now = {"config": cfg.to_json(), **meta}
        differ = differing_keys(before, now)
        if differ:
            raise ResumeMismatch(f"{out} holds a finished run with other settings "
                                 f"({describe_differences(before, now, differ, 'finished')}); "
                                 "choose another --out, or delete that folder to train again")
        print(f"{out} is finished with these settings; nothing to do")
        return done
    if cfg.method == "full" and model.dtype in (torch.bfloat16, torch.float16):
        # bf16 keeps 8 significant bits: near |w| = 0.05 its spacing is 2.4e-4, so an Adam step of
        # about lr (2e-5) rounds back to the same weight; the adapters keep float32 deltas
        warnings.warn(f"full SFT of a {str(model.dtype).removeprefix('torch.')} model: updates smaller than "
                      "the weights' precision are lost, so at small learning rates it hardly trains and is no fair "
                      "baseline for precise SFT or LoRA (which keep float32 deltas); load the model in float32 "
                      "(--dtype float32) to compare them", stacklevel=2)
    data = tokenize(model.tokenizer, examples, cfg.max_length)
    total_params = sum(p.numel() for p in model.hf.parameters())
    tuned = make_trainable(model, cfg, components)
    acc = accelerator or make_accelerator(model.device.type == "cpu")
    t0 = time.perf_counter()
    result = train(tuned, data, cfg, out, meta, accelerator=acc, progress=progress)
    info = {**meta, "config": cfg.to_json(), "kv": cfg.kv if cfg.method == "precise" else None,
            "tuned_params": tuned.n_trainable, "total_params": total_params,
            "train": {"steps": len(result.losses), "steps_this_run": result.steps, "samples_this_run": result.samples,
                      "seconds_this_run": round(result.seconds, 3),
                      "samples_per_second": result.samples_per_second, "final_loss": result.losses[-1],
                      "losses": result.losses, "wall_seconds": round(time.perf_counter() - t0, 3),
                      "processes": acc.num_processes, "device": str(model.device)},
            "versions": versions()}
    acc.wait_for_everyone()
    if acc.is_main_process:
        if cfg.method == "precise":
            save_adapter(tuned, out, {k: info[k] for k in ("base_model", "base_fingerprint", "method", "components",
                                                            "data", "config", "kv", "versions", "tuned_params")})
        elif cfg.method == "lora":
            tuned.module.save_pretrained(str(out / "lora"))
        else:
            model.hf.save_pretrained(out / "model", safe_serialization=True)
            model.tokenizer.save_pretrained(out / "model")
        write_json(out / INFO, info)
    acc.wait_for_everyone()
    return info


def describe(info: dict) -> str:
    t = info["train"]
    what = f"{info['method']} SFT"
    if info.get("components"):
        c = info["components"]
        what += f" of {len(c['heads'])} heads" + (f" and MLPs {c['mlps']}" if c["mlps"] else "") + f" ({c['source']})"
    return (f"{what}: {info['tuned_params']:,} tuned parameters of {info['total_params']:,} "
            f"({100 * info['tuned_params'] / info['total_params']:.3g}%); {t['steps']} steps, final loss "
            f"{t['final_loss']:.4f}, {t['samples_per_second']:.2f} samples/s")


__all__ = ["describe", "finetune"]

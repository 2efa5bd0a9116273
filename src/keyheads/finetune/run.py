"""One fine-tuning run into one folder: train, then write the adapter (or model) and finetune.json."""
from __future__ import annotations

import shutil
import time
import warnings
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from ..components import Components
from ..io import read_json, write_json
from ..log import logger
from ..models.fingerprint import base_fingerprint
from ..models.loading import place
from ..models.model import HookedModel
from ..provenance import versions
from ..results.finetune import FinetuneResult, Training
from .adapter import INFO, save_adapter
from .checkpoint import ResumeMismatch, describe_differences, differing_keys
from .data import Example, examples_sha256, tokenize
from .model import check_components, make_trainable
from .parallel import make_parallel
from .settings import FinetuneSettings
from .train import train

# what an adapter file's metadata keeps of the run's record, in this order
ADAPTER_META = ("base_model", "base_fingerprint", "method", "components", "data", "config", "kv", "versions",
                "tuned_params")


def finetune(model: HookedModel, examples: list[Example], cfg: FinetuneSettings, out: str | Path,
             components: Components | None = None, data_name: str = "", accelerator=None,
             progress: bool = True, device: str | torch.device | None = None,
             compute_dtype: torch.dtype | None = None) -> FinetuneResult:
    """Train `model` (modified in place) and write `out`; returns its record (finetune.json).

    A finished folder with the same settings is returned as it is; an interrupted one resumes.
    Under FSDP2 (cfg.parallel "fsdp") the model is sharded in place: use it only through what this
    writes. `device` is where FSDP2 computes (default: where the model is) and `compute_dtype` what
    it multiplies in (default: the model's dtype); the trained weights stay float32.
    """
    out = Path(out)
    if cfg.method != "precise":
        components = None
    else:
        components = check_components(components)  # before any work
    meta = {"base_model": model.name, "base_fingerprint": base_fingerprint(model), "method": cfg.method,
            "components": components.to_json() if components else None,
            "data": {"name": data_name, "sha256": examples_sha256(examples), "n": len(examples)}}
    if (out / INFO).is_file():
        done = FinetuneResult.from_json(read_json(out / INFO))
        saved = done.to_json()
        # read as settings, so that a record of an older release compares by what it means
        before = {"config": FinetuneSettings.from_json(done.config.to_json()).to_json(), **{k: saved[k] for k in meta}}
        now = {"config": cfg.to_json(), **meta}
        differ = differing_keys(before, now)
        if differ:
            raise ResumeMismatch(f"{out} holds a finished run with other settings "
                                 f"({describe_differences(before, now, differ, 'finished')}); "
                                 "choose another --out, or delete that folder to train again")
        logger.info("%s is finished with these settings; nothing to do", out)
        return done
    if cfg.method == "full" and model.dtype in (torch.bfloat16, torch.float16) and cfg.parallel != "fsdp":
        # bf16 keeps 8 significant bits: near |w| = 0.05 its spacing is 2.4e-4, so an Adam step of
        # about lr (2e-5) rounds back to the same weight; the adapters keep float32 deltas
        warnings.warn(f"full SFT of a {str(model.dtype).removeprefix('torch.')} model: updates smaller than "
                      "the weights' precision are lost, so at small learning rates it hardly trains and is no fair "
                      "baseline for precise SFT or LoRA (which keep float32 deltas); load the model in float32 "
                      "(--dtype float32) to compare them, or train with --parallel fsdp (fp32 master weights, "
                      "compute in --dtype)", stacklevel=2)
    data = tokenize(model.tokenizer, examples, cfg.max_length)
    total_params = sum(p.numel() for p in model.hf.parameters())
    tuned = make_trainable(model, cfg, components)
    if device is None:  # where the model is; a model whose weights are still to be read computes where place says
        device = model.device if model.device.type != "meta" else place(sharded=True).run_on
    par = make_parallel(cfg.parallel, torch.device(device), compute_dtype or model.dtype, cfg.offload, accelerator)
    t0 = time.perf_counter()
    result = train(tuned, data, cfg, out, meta, parallel=par, progress=progress)
    trained = Training(steps=len(result.losses), steps_this_run=result.steps, samples_this_run=result.samples,
                       seconds_this_run=round(result.seconds, 3), samples_per_second=result.samples_per_second,
                       final_loss=result.losses[-1], losses=result.losses,
                       wall_seconds=round(time.perf_counter() - t0, 3), processes=par.world, parallel=par.name,
                       device=str(par.device))
    info = FinetuneResult(**meta, config=cfg.to_json(), kv=cfg.kv if cfg.method == "precise" else None,
                          tuned_params=tuned.n_trainable, total_params=total_params, train=trained,
                          versions=versions())
    par.barrier()
    # Under FSDP2 every process gathers the shards (a collective); the main process writes them.
    if cfg.method == "precise":
        tensors = tuned.adapter_tensors()
        if par.is_main:
            record = info.to_json()
            save_adapter(tuned, out, {k: record[k] for k in ADAPTER_META}, tensors=tensors)
    else:
        state = _whole_state(tuned.module) if par.sharded else None
        if par.is_main:
            if cfg.method == "lora":
                tuned.module.save_pretrained(str(out / "lora"), state_dict=state)
            else:
                model.hf.save_pretrained(out / "model", safe_serialization=True, state_dict=state)
                model.tokenizer.save_pretrained(out / "model")
    if par.is_main:
        write_json(out / INFO, info.to_json())
        # Once finetune.json is written a re-run reads it, never the checkpoint, which is then dead weight:
        # for full SFT the weights and optimizer moments again (9 GB at 1.5B with 8-bit AdamW).
        shutil.rmtree(out / "checkpoint", ignore_errors=True)
    par.barrier()
    return info


def _whole_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trained tensors of a sharded module (every tensor for full SFT, the factors for LoRA), whole, in
    the main process's CPU memory (the others get an empty dict), under the names save_pretrained expects.
    LoRA's frozen base is not gathered: PEFT writes only the factors."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    state = get_model_state_dict(module, options=options)
    # A tied unembedding is one parameter under two names. save_pretrained drops the second name only when
    # the two tensors share memory, which the gathered copies no longer do, so it is dropped here: the files
    # are then the same whatever the process count.
    first: dict[int, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if first.setdefault(id(param), name) != name:
            state.pop(name, None)
    return state


def describe(info: FinetuneResult) -> str:
    t, c = info.train, info.components
    what = f"{info.method} SFT"
    if c is not None:
        what += (f" of {len(c.heads)} heads" + (f" and MLPs {list(c.mlps)}" if c.mlps else "")
                 + f" ({c.source})")
    return (f"{what}: {info.tuned_params:,} tuned parameters of {info.total_params:,} "
            f"({100 * info.tuned_params / info.total_params:.3g}%); {t.steps} steps, final loss "
            f"{t.final_loss:.4f}, {t.samples_per_second:.2f} samples/s")


__all__ = ["describe", "finetune"]

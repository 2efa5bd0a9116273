"""A patching run: sweep the samples batch by batch, checkpoint, and write the outputs.

The per-sample quantities are checkpointed atomically after every batch
(per_sample.npz); an interrupted run resumes from the batches it finished. The
checkpoint records what produced it, and a run with different settings refuses it.

Under several processes (accelerate launch, torchrun) each takes every N-th batch, checkpoints
its own per_sample.rankKofN.npz, and the per-sample arrays are gathered at the end. A resume
reads every checkpoint in the folder, so it may use a different number of processes.
"""
from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .. import distributed
from ..effects import Effects
from ..errors import ResumeMismatch
from ..io import atomic_write_bytes, file_sha256
from ..log import logger
from ..models.model import HookedModel
from ..provenance import changed_settings
from .activation import activation_patch_batch
from .attribution import attribution_patch_batch, integrated_patch_batch
from .naive import naive_path_patch_batch
from .path import path_patch_batch
from .results import aggregate
from .samples import batches, load_patch_samples
from .settings import IdentifySettings, check_method, check_metric

PATCH_METHODS = {  # the code of each of settings.METHODS, in its order
    "path": path_patch_batch,
    "activation": activation_patch_batch,
    "attribution": attribution_patch_batch,
    "attribution-ig": integrated_patch_batch,
    "path-naive": naive_path_patch_batch,
}


def run_sweep(model: HookedModel, data: str | Path, config: IdentifySettings, out: Path | None = None,
          batch_size: int = 16, progress: bool = True) -> tuple[Effects, dict]:
    """Run the patching sweep over a pairs file; returns (effects, per-sample arrays). `batch_size`: prompts
    per forward pass, at most (batches are cut where token lengths jump; a checkpoint is of one batch size).

    Under several processes every rank must call it; each computes its share of the
    batches and every rank returns the full arrays.
    """
    check_method(config.method)
    check_metric(config.metric)
    samples = load_patch_samples(model, data, limit=config.limit, first_token_only=config.first_token)
    n, L, H = len(samples), model.n_layers, model.n_heads
    # what the per-sample arrays depend on: the model, the data, the batching and the settings that act before them
    signature = {"model": model.source, "data_sha256": file_sha256(data), "dtype": str(model.dtype),
                 "batch_size": batch_size, **config.checkpoint_key()}
    state = _resume(out, signature, n, L, H)
    fn = PATCH_METHODS[config.method]
    # Whole batches are shared out, not samples: each batch is then exactly the one a single
    # process would run, so any number of processes gives the same numbers.
    everything = list(batches(samples, batch_size, model.device))
    keys = ("original", "heads", "mlps")

    def run(mine: list) -> list[dict]:
        total = sum(len(b.index) for b in mine)
        done = sum(int(state["done"][b.index].all()) * len(b.index) for b in mine)
        with tqdm(total=total, initial=done, desc=f"{config.method} patching", unit="sample",
                  disable=not (progress and distributed.is_main())) as bar:
            for batch in mine:
                idx = np.asarray(batch.index)
                if state["done"][idx].all():
                    continue
                result = fn(model, batch, config.metric)
                state["original"][idx] = result.original.float().cpu().numpy()
                state["heads"][idx] = result.heads.float().cpu().numpy()
                state["mlps"][idx] = result.mlps.float().cpu().numpy()
                state["done"][idx] = True
                if out is not None:
                    _checkpoint(out, signature, state)
                bar.update(len(idx))
        return [{k: state[k][np.asarray(b.index)] for k in keys} for b in mine]

    start = time.perf_counter()
    rows = distributed.map_sharded(run, everything)
    for batch, row in zip(everything, rows):
        idx = np.asarray(batch.index)
        for k in keys:
            state[k][idx] = row[k]
        state["done"][idx] = True
    state["seconds"] = time.perf_counter() - start
    effects = aggregate(config.metric, config.method, model.name, signature["data_sha256"],
                                state["original"], state["heads"], state["mlps"], config.min_abs_logit)
    return effects, state


def checkpoint_name(rank: int | None = None, world: int | None = None) -> str:
    """per_sample.npz for one process (unchanged from before processes could share a run), else per rank."""
    rank = distributed.rank() if rank is None else rank
    world = distributed.world() if world is None else world
    return "per_sample.npz" if world == 1 else f"per_sample.rank{rank}of{world}.npz"


def checkpoints(out: Path) -> list[Path]:
    """Every checkpoint in a run folder, of any number of processes."""
    out = Path(out)
    single = out / checkpoint_name(0, 1)
    return ([single] if single.exists() else []) + sorted(out.glob("per_sample.rank*of*.npz"))


def clear_checkpoints(out: Path) -> None:
    """Start a run folder over (--restart). Under several processes the main one deletes, then all go on."""
    if distributed.is_main():
        for path in checkpoints(out):
            path.unlink()
    distributed.barrier()


def _checkpoint(out: Path, signature: dict, state: dict) -> None:
    buf = io.BytesIO()
    np.savez(buf, signature=np.array(json.dumps(signature, sort_keys=True)),
             **{k: state[k] for k in ("original", "heads", "mlps", "done")})
    atomic_write_bytes(out / checkpoint_name(), buf.getvalue())


def _resume(out: Path | None, signature: dict, n: int, L: int, H: int) -> dict:
    state = {"original": np.zeros(n, np.float32), "heads": np.zeros((n, L, H), np.float32),
             "mlps": np.zeros((n, L), np.float32), "done": np.zeros(n, bool)}
    found = [] if out is None else checkpoints(out)
    for path in found:  # samples are independent: whatever any process finished is reusable
        with np.load(path) as saved:
            old = json.loads(str(saved["signature"]))
            if old != signature:
                raise ResumeMismatch(f"{path} holds a run with different settings "
                                     f"({', '.join(k for k, _, _ in changed_settings(old, signature))}); "
                                     "use another --out folder or pass --restart")
            done = saved["done"]
            for k in ("original", "heads", "mlps"):
                state[k][done] = saved[k][done]
            state["done"] |= done
    if (progress_note := int(state["done"].sum())) and distributed.is_main():
        where = found[0] if len(found) == 1 else f"{len(found)} checkpoints in {out}"
        logger.info("resuming: %d/%d samples already done in %s", progress_note, n, where)
    return state

"""A model that FSDP2 shards before any weight is read, so that no process ever holds the whole model.

    model = skeleton(folder, dtype)           # modules only: every parameter on the meta device
    ...                                        # make it trainable (deltas, LoRA factors), fully_shard it
    restore = materialize(module, device)      # memory for this process's own shards only
    read_own_shards(model.hf, folder)          # each process reads only its own slices of the files

`keyheads finetune --parallel fsdp` and the run's fine-tuning stage load this way (models.load_placed with
sharded=True). Buffers (the rotary tables) are computed as usual when the skeleton is built: they are small
and not in the weights files. The reading is torch.distributed.checkpoint's Hugging Face reader, which plans
the slices each process needs and copies each into its shard, converting the dtype: a process reads 1/world of
every tensor, never a whole one. Its slices are read with plain file reads (SlicedFile) rather than through
safetensors' memory map, so that the pages of the files stay page cache instead of the process's resident memory.
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import torch
from accelerate import init_empty_weights
from safetensors import SafetensorError
from torch import nn
from torch.distributed import checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor
from torch.futures import Future
from transformers import AutoConfig, AutoModelForCausalLM

from ..errors import BadFile
from .hf_internals import names_in_files

PEFT_BASE = ".base_layer"  # PEFT's LoRA layers keep the wrapped projection under this name


def has_safetensors(folder: str | Path) -> bool:
    return Path(folder).is_dir() and any(Path(folder).glob("*.safetensors"))


def skeleton(folder: str | Path, dtype: torch.dtype) -> nn.Module:
    """The model of `folder` with its parameters on the meta device (no memory, no weight read) and its
    buffers computed on the CPU."""
    config = AutoConfig.from_pretrained(str(folder))
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # a tied unembedding is the embedding (from_pretrained ties it when it loads)
    return model


def is_meta(tensor: torch.Tensor) -> bool:
    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).device.type == "meta"


def materialize(module: nn.Module, device: torch.device) -> set[str]:
    """Give every meta tensor of a (sharded) module memory on `device`, uninitialised, and return their
    names; the tensors that were real already (buffers, and anything made before sharding) keep their
    values."""
    tensors = [*module.named_parameters(), *module.named_buffers()]
    empty = {name for name, t in tensors if is_meta(t)}
    keep = {name: (t.to_local() if isinstance(t, DTensor) else t).detach().clone()
            for name, t in [*module.named_parameters(), *module.named_buffers()] if not is_meta(t)}
    module.to_empty(device=device)  # FSDP2's way: a sharded parameter gets its local shard only
    with torch.no_grad():
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if name in keep:
                (t.to_local() if isinstance(t, DTensor) else t).copy_(keep[name])
    return empty


def without_peft(name: str) -> str:
    """A tensor's name in the model that PEFT wrapped."""
    return name.replace(PEFT_BASE, "")


# safetensors' dtype names (its format's header) -> torch's
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


class SlicedFile:
    """A safetensors file read slice by slice with plain reads: `get_slice(name)[slices]` as safetensors' own
    `safe_open(...).get_slice(name)[slices]` gives it, reading only the rows of the first dimension that the
    slices ask for (a shard of FSDP2's is a range of rows) and holding nothing of the file but those bytes."""

    def __init__(self, path: str | Path):
        self.file = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by __exit__)
        (size,) = struct.unpack("<Q", self.read(8, 0).numpy().tobytes())
        self.header = json.loads(self.read(size, 8).numpy().tobytes())
        self.start = 8 + size

    def __enter__(self) -> SlicedFile:
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()

    def read(self, n: int, offset: int) -> torch.Tensor:
        """`n` bytes from `offset` as a uint8 tensor (numpy's fromfile reads in as many calls as the system needs).
        A file that ends early gives fewer: the tensor made of them does not take its dtype or shape, an error
        that read_own_shards reports as a truncated file."""
        self.file.seek(offset)
        return torch.from_numpy(np.fromfile(self.file, dtype=np.uint8, count=n)) if n \
            else torch.empty(0, dtype=torch.uint8)  # numpy's empty array has a stride torch cannot view

    def get_slice(self, name: str) -> _Rows:
        entry = self.header[name]
        return _Rows(self, DTYPES[entry["dtype"]], entry["shape"], self.start + entry["data_offsets"][0])


class _Rows:
    def __init__(self, file: SlicedFile, dtype: torch.dtype, shape: list[int], offset: int):
        self.file, self.dtype, self.shape, self.offset = file, dtype, shape, offset

    def __getitem__(self, slices: tuple[slice, ...]) -> torch.Tensor:
        first = slices[0] if slices else slice(None)
        lo, hi, _ = first.indices(self.shape[0]) if self.shape else (0, 1, 1)
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        rows = self.file.read((hi - lo) * row, self.offset + lo * row).view(self.dtype)
        rest = (slice(None), *slices[1:])  # the first dimension's slice is read already
        return rows.reshape(hi - lo, *self.shape[1:])[rest] if self.shape else rows.reshape(())


class PlainReader(dcp.HuggingFaceStorageReader):
    """torch's Hugging Face reader, its slices read through SlicedFile: the same plan and the same copies into
    the shards, without mapping the files into the process."""

    def read_data(self, plan, planner) -> Future[None]:
        per_file: dict[str, list] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for name, items in per_file.items():
            with SlicedFile(name) as f:
                for item in items:
                    self._process_read_request(f, item, planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done


def read_own_shards(hf: nn.Module, folder: str | Path, names: set[str]) -> None:
    """Fill the tensors `names` of `hf` (after materialize) from the safetensors files of `folder`; under
    FSDP2 each process reads only the slices of its own shards. A tensor that the files do not have is an
    error, except a tied unembedding (it is the embedding)."""
    reader = PlainReader(str(folder))
    # transformers finds its renamings by the model's class, which fully_shard has replaced: ask a fresh skeleton
    try:
        files = set(reader.read_metadata().state_dict_metadata)
    except (SafetensorError, OSError) as err:
        raise unreadable(folder, err) from None
    stored = names_in_files(skeleton(folder, torch.float32), files)
    tied = {id(p) for p in [getattr(hf.get_input_embeddings(), "weight", None)] if p is not None}
    state: dict[str, torch.Tensor] = {}
    for name, tensor in hf.state_dict(keep_vars=True).items():
        if name not in names:
            continue
        key = without_peft(name)
        if key in stored:
            state[stored[key]] = tensor.data if isinstance(tensor, nn.Parameter) else tensor
        elif id(tensor) not in tied:
            raise BadFile(f"{folder}: the weights files have no tensor {key!r}, which this model needs; they are "
                          "not this model's, or transformers renames their keys on loading: train without "
                          "--parallel fsdp, or save the model again with save_pretrained")
    try:
        dcp.load(state, storage_reader=reader)
    except (CheckpointException, SafetensorError, OSError) as err:  # dcp wraps a reader's error in its own
        raise unreadable(folder, err) from None


def unreadable(folder: str | Path, err: BaseException) -> BadFile:
    """The error for a weights file cut short by a copy or a full disk, or another model's."""
    return BadFile(f"{folder}: its weights cannot be read ({' '.join(str(err).split())}); a file is truncated or "
                   "not this model's: copy the model folder again")

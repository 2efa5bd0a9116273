"""Fingerprints of a model's weights: the keys under which results and adapters are stored.

A model loaded from a folder is fingerprinted by its files (a converted bundled model by its
manifest's verified sums), a hub model by its id and commit, an in-memory model by its tensors.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from accelerate.utils import align_module_device

from ..io import file_sha256
from .hf_internals import commit_hash
from .model import HookedModel


def short_sha(text: str) -> str:
    """The first 20 hex digits of the text's sha256."""
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def parameters_fingerprint(model: HookedModel) -> str:
    """sha256 of every tensor of the state dict (as float32) with its name. A tensor that accelerate
    offloaded (on the meta device outside its module's forward) is read through its module's hook."""
    h = hashlib.sha256()
    for name, p in model.hf.state_dict().items():
        h.update(name.encode())
        if p.device.type == "meta":
            owner, _, attr = name.rpartition(".")
            module = model.hf.get_submodule(owner)
            with align_module_device(module):
                p = getattr(module, attr)
                h.update(p.detach().to(torch.float32).cpu().numpy().tobytes())
        else:
            h.update(p.detach().to(torch.float32).cpu().numpy().tobytes())
    return h.hexdigest()


def weights_fingerprint(model: HookedModel) -> str:
    """Hash of the files the model was loaded from (weights, config, tokenizer)."""
    folder = Path(model.source)
    if not folder.is_dir():  # a hub id: the resolved commit when transformers recorded it
        return short_sha(f"hub:{model.source}:{commit_hash(model.config)}")
    manifest = folder / "keyheads-manifest.json"
    if manifest.is_file():  # converted bundled models carry verified sha256 sums already
        return short_sha(json.dumps(json.loads(manifest.read_text())["files"], sort_keys=True))
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    return short_sha(json.dumps({p.name: file_sha256(p) for p in files}, sort_keys=True))


def base_fingerprint(model: HookedModel) -> str:
    """Fingerprint of the base weights: of its files when it came from a folder, else of the tensors."""
    if Path(model.source).is_dir() or commit_hash(model.config):
        return weights_fingerprint(model)
    return short_sha(parameters_fingerprint(model))

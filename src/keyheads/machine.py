"""Up-front checks of settings that depend on this machine: device, dtype, writable paths.

Each check returns the value (normalised where there is a canonical spelling) or raises
SettingError naming the key, the value given and what is allowed, so that a typo or a device
this machine lacks fails in a second, before any model loads. The keys are config keys
("device") or flags ("--device"); a flag reads as on the command line:

    --device cuda: this machine has no CUDA GPU (torch.cuda.is_available() is False); use cpu
    device: 'cuda:7' given; this machine has no CUDA GPU (...)

The settings models (keyheads.config) call these checks from their validators. torch is imported only when
a check that asks it about this machine runs (`_torch`), not with this module.
"""
from __future__ import annotations

import importlib.util
import os
import re
import tempfile
from pathlib import Path
from typing import Any, overload

from .errors import SettingError

# The dtype names load_model accepts (keyheads.models.loading uses this table): name -> torch attribute.
DTYPES = {
    "float32": "float32", "fp32": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16",
    "float64": "float64", "fp64": "float64",
}
_NAMES = tuple(dict.fromkeys(DTYPES.values()))
DTYPE_HELP = (f"{', '.join(_NAMES[:-1])} or {_NAMES[-1]} "  # float32, bfloat16, float16 or float64 (or fp32, ...)
              f"(or {', '.join(alias for alias in DTYPES if alias not in _NAMES)})")
DEVICE_HELP = "cpu, cuda, cuda:N, mps or auto"
SIZE_HELP = "80GiB, 500MB or a number of bytes (GiB, MiB, KiB = 2^30, 2^20, 2^10 bytes; GB, MB, KB = 10^9, 10^6, 10^3)"
MAX_MEMORY_HELP = "DEVICE=SIZE,... with DEVICE cuda:N (or N), cpu or mps and SIZE like 20GiB, 500MB or bytes"
# every size a setting takes, in bytes: binary GiB, MiB, KiB (and TiB), decimal GB, MB, KB (and TB), plain bytes
UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
         "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)


def size_bytes(text: str) -> int | None:
    """'80GiB', '80 GB', '500mb', '1073741824' -> bytes; None for text that is not a size. The one reader of
    sizes (UNITS)."""
    m = _SIZE.fullmatch(text)
    if m is None or m.group(2).lower() not in UNITS:
        return None
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def parse_bytes(text: str, key: str = "size") -> int:
    """A positive size (see size_bytes) in bytes; anything else is a SettingError naming `key`."""
    size = size_bytes(text)
    if size is None or size <= 0:
        raise SettingError(key, text, f"expected a positive size, e.g. {SIZE_HELP}")
    return size


# ---- devices and dtypes -------------------------------------------------------------------------
def _torch() -> Any:
    """torch, imported when a check of a GPU or of the thread count runs rather than with this module: importing
    torch takes seconds and memory, and the settings modules (keyheads.config.base) must load without it
    (tests/test_imports.py). The one function here that imports it."""
    import torch  # noqa: PLC0415 - imported on use, see the docstring

    return torch


def set_torch_threads(threads: int) -> None:
    """torch's CPU thread count (the one machine setting that acts before a model loads)."""
    _torch().set_num_threads(threads)


def check_device(value: str | None, key: str = "device") -> str | None:
    """None (cuda if available, else cpu), "cpu", "cuda", "cuda:N", "mps" or "auto" (accelerate's
    device_map="auto"), provided this machine has it."""
    if value is None or value == "cpu":
        return value
    if value == "auto":
        if importlib.util.find_spec("accelerate") is None:
            raise SettingError(key, value, "sharding needs the package accelerate (pip install accelerate); "
                                           "or give cpu or cuda")
        return value
    if isinstance(value, str) and (m := re.fullmatch(r"cuda(?::(\d+))?", value)):
        torch = _torch()
        if not torch.cuda.is_available():
            raise SettingError(key, value, "this machine has no CUDA GPU (torch.cuda.is_available() is False); use cpu")
        count = torch.cuda.device_count()
        if m.group(1) is not None and int(m.group(1)) >= count:
            raise SettingError(key, value, f"this machine has {count} CUDA GPU{'s' * (count != 1)} "
                                           f"(cuda:0 to cuda:{count - 1})")
        return value
    if value == "mps":
        if not _torch().backends.mps.is_available():
            raise SettingError(key, value, "MPS (Apple GPU) is not available on this machine; use cpu")
        return value
    raise SettingError(key, value, f"unknown device; use {DEVICE_HELP}")


def parse_max_memory(value: str, key: str = "max_memory") -> dict[int | str, int]:
    """accelerate's max_memory dict from "cuda:0=20GiB,cpu=60GiB" (or "0=20GiB,cpu=60GiB"): GPU index
    or "cpu"/"mps" -> bytes. A GPU this machine lacks, a repeated device or a malformed part is an error."""
    limits: dict[int | str, int] = {}
    for part in value.split(","):
        m = re.fullmatch(r"\s*(cuda:\d+|\d+|cpu|mps)\s*=(.*)", part, re.IGNORECASE)
        size = size_bytes(m.group(2)) if m else None
        if m is None or size is None:
            raise SettingError(key, value, f"cannot read {part.strip()!r}; use {MAX_MEMORY_HELP}, "
                                           "e.g. cuda:0=20GiB,cpu=60GiB")
        name = m.group(1).lower()
        device: int | str = name
        if name[0].isdigit() or name.startswith("cuda"):
            device = int(name.removeprefix("cuda:"))
            check_device(f"cuda:{device}", key)  # a GPU this machine has
        elif name == "mps":
            check_device("mps", key)
        if device in limits:
            raise SettingError(key, value, f"{name} is given twice")
        limits[device] = size
    return limits


def check_max_memory(value: str | None, key: str = "max_memory") -> str | None:
    """None or a per-device limit that parse_max_memory reads (kept as given: the text is the setting)."""
    if value is not None:
        parse_max_memory(value, key)
    return value


@overload
def check_dtype(value: str, key: str = ..., device: str | None = ...) -> str: ...
@overload
def check_dtype(value: None, key: str = ..., device: str | None = ...) -> None: ...
def check_dtype(value: str | None, key: str = "dtype", device: str | None = None) -> str | None:
    """None (float32 on CPU, bfloat16 on a GPU) or a name from DTYPES; returns the canonical name.

    float16 on a CPU is allowed (load_model supports it; it is slow). bfloat16 on a CUDA GPU
    without native support (compute capability below 8.0) is an error. `device` is the device
    the model will go to (None: the one load_model picks).
    """
    if value is None:
        return None
    name = DTYPES[value] if isinstance(value, str) and value in DTYPES else None
    if name is None:
        raise SettingError(key, value, f"unknown dtype; use {DTYPE_HELP}")
    if name == "bfloat16" and (device is None or device == "auto" or str(device).startswith("cuda")):
        torch = _torch()
        if torch.cuda.is_available():
            index = int(device.split(":")[1]) if device and ":" in device else torch.cuda.current_device()
            major, minor = torch.cuda.get_device_capability(index)
            if major < 8:
                raise SettingError(key, value, f"{torch.cuda.get_device_name(index)} (compute capability "
                                               f"{major}.{minor}) has no bfloat16 support; use float16 or float32")
    return name


# ---- output folders and files -------------------------------------------------------------------
def _cannot_create(path: Path) -> str | None:
    """Why a path that does not exist yet could not be made (None: it could)."""
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot be created: {ancestor} is a file, not a folder"
    if not _can_write_in(ancestor):
        return f"cannot be created: {ancestor} is not writable"
    return None


def _can_write_in(folder: Path) -> bool:
    """Whether a file can be made in `folder`, by making one: permission bits do not bind root, and
    read-only or virtual file systems (/proc) say no only when asked."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        fd, probe = tempfile.mkstemp(prefix=".keyheads-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def check_writable_dir(path: str | Path, key: str = "out") -> Path:
    """The folder exists and is writable, or it could be created. Creates nothing."""
    folder = Path(path).expanduser()
    if folder.exists():
        if not folder.is_dir():
            raise SettingError(key, str(path), "is a file; give a folder")
        if not _can_write_in(folder):
            raise SettingError(key, str(path), "the folder is not writable")
        return folder
    if why := _cannot_create(folder):
        raise SettingError(key, str(path), why)
    return folder


def check_writable_file(path: str | Path, key: str = "out") -> Path:
    """A file that can be written (or replaced): not a folder, in a folder that is or can be made."""
    file = Path(path).expanduser()
    if file.is_dir():
        raise SettingError(key, str(path), "is a folder; give a file name")
    if file.exists():
        if not _can_write_in(file.parent):  # files are replaced atomically, via the folder
            raise SettingError(key, str(path), f"its folder {file.parent} is not writable")
    elif why := _cannot_create(file):
        raise SettingError(key, str(path), why)
    return file

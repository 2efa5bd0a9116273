"""load_model: a bundled name, a GGUF file, a local HF folder or a hub id -> HookedModel.

GGUF files are de-quantised into fp32 once (30-80 s; tensor by tensor, streamed_gguf) and cached as
safetensors under $KEYHEADS_CACHE (default ~/.cache/keyheads). The cache folder is
written to a temporary name, verified, and renamed, and carries a manifest of sha256
sums; a truncated or corrupt cache is detected and rebuilt, never loaded.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG

import torch
from filelock import FileLock
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from .. import distributed
from ..errors import BadFile, MissingPackage, ModelNotFound, SettingError
from ..io import atomic_folder, atomic_write_text, file_sha256
from ..log import logger
from ..machine import check_dtype, parse_max_memory
from .bundled import BUNDLED, DEFAULT_MODEL
from .families import family_for
from .model import HookedModel
from .sharded import has_safetensors, skeleton, unreadable
from .streamed_gguf import StreamedModel

MANIFEST = "keyheads-manifest.json"
VERIFIED = "keyheads-verified.json"  # the stat results of a folder whose sums matched (_cache_valid)


def cache_root() -> Path:
    return Path(os.getenv("KEYHEADS_CACHE") or Path.home() / ".cache" / "keyheads")


def _cache_valid(folder: Path) -> bool:
    """Whether `folder` is a whole converted model: its manifest lists a config and weights, and every file it
    lists is there with its size and sha256. (A manifest written over a folder that lacks them, as an earlier
    multi-process conversion left one, does not validate.)

    Hashing costs about a second per GiB at every load (6 GiB for Qwen2.5-1.5B), so a folder whose sums
    matched keeps a stamp of its files' stat results (size, mtime, ctime, inode; ctime cannot be set back by
    hand), and a load whose files stat the same trusts that check. Any write to a file changes its stat and
    brings the full check back."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return False
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError):
        return False
    if "config.json" not in files or not any(name.endswith(".safetensors") for name in files):
        return False
    stats = {name: _stat(folder / name) for name in (*files, MANIFEST)}
    for name, meta in files.items():
        stat = stats[name]
        if stat is None or stat[0] != meta["size"]:
            return False
    stamp = folder / VERIFIED
    try:
        if json.loads(stamp.read_text()) == stats:
            return True
    except (OSError, ValueError):
        pass
    if any(file_sha256(folder / name) != meta["sha256"] for name, meta in files.items()):
        return False
    try:
        atomic_write_text(stamp, json.dumps(stats))
    except OSError:  # a read-only cache: it stays valid, and is hashed again at the next load
        pass
    return True


def _stat(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino] if S_ISREG(st.st_mode) else None


def _gguf_key(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:16]


def tie_embeddings(model) -> None:
    """Tie a model's unembedding and embedding back together, keeping the unembedding's values.

    A GGUF of a tied model may carry the unembedding as its own tensor (llama.cpp quantises it
    more finely, Q6_K beside a Q4_K embedding); transformers then builds an untied model with one
    more vocabulary-sized matrix than the original, which full SFT would train as two. The two are
    the same matrix up to quantisation, and the finer one is the closer to the original.
    """
    if model.config.tie_word_embeddings:
        return
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(model.get_output_embeddings().weight)
    model.config.tie_word_embeddings = True
    model.get_output_embeddings().weight = model.get_input_embeddings().weight


def _convert_gguf(gguf: Path, target: Path, tied: bool = False, whole: bool = False) -> None:
    """De-quantise a GGUF file into an fp32 safetensors folder, atomically (`whole`: see _read_gguf)."""
    model, tokenizer = _read_gguf(gguf, tied, whole)
    _save_converted(model, tokenizer, gguf, target)


def _read_gguf(gguf: Path, tied: bool = False, whole: bool = False):
    """The GGUF file's model and its tokenizer. The model is de-quantised tensor by tensor as it is saved
    (streamed_gguf: the same files, without the whole float32 model in memory) where its architecture allows;
    else, or `whole`, by transformers into fp32 all at once."""
    _require("gguf", "pip install gguf")
    folder, filename = str(gguf.parent), gguf.name
    with _one_gguf_reader():
        _parse_gguf(gguf)  # a truncated or foreign file is named here, before transformers' readers trip on it
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        model = None if whole else StreamedModel.of(gguf, tied)
        model = model or AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    if tied:
        tie_embeddings(model)
    return model, tokenizer


def _parse_gguf(gguf: Path) -> None:
    import gguf as gguf_package  # noqa: PLC0415 -- optional: only GGUF conversion needs it (checked by _require)

    try:
        gguf_package.GGUFReader(str(gguf))  # the shared reader inside _one_gguf_reader: parsed once for all
    except (ValueError, IndexError, OSError) as err:  # gguf says "GGUF magic invalid", or numpy a too short buffer
        raise BadFile(f"{gguf} is not a GGUF file that can be read ({_one_line(err)}): it is truncated or of "
                      "another format; download or copy it again") from None


@contextmanager
def _one_gguf_reader():
    """transformers opens the GGUF file three times (tokenizer, config, weights), and each GGUFReader parses
    every metadata field element by element: for Gemma-3's 262k-token vocabulary, about 20 s a time. The
    reader only reads (a read-only memory map), so the first one serves all three."""
    import gguf  # noqa: PLC0415 -- optional: only GGUF conversion needs it (checked by _require above)

    original, readers = gguf.GGUFReader, {}

    def shared_reader(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = shared_reader  # transformers imports it from the package at each call
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _save_converted(model, tokenizer, gguf: Path, target: Path) -> None:
    """Write the de-quantised model and its manifest to `target`, atomically, from whichever process converts."""
    # A GGUF-loaded model refuses save_pretrained while it still looks quantised.
    model.hf_quantizer = None
    model.config.quantization_config = None
    model.is_quantized = False
    # Under a launcher, transformers writes a model's files from rank 0 only; the cache is converted by
    # whichever process holds its lock, which need not be rank 0, and that process must write every file.
    model.should_save_on_this_rank = lambda is_main_process: True
    with atomic_folder(target, replace=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        files = {
            p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)} for p in sorted(tmp.iterdir()) if p.is_file()
        }
        (tmp / MANIFEST).write_text(json.dumps({"source": str(gguf), "files": files}, indent=1))


def _require(module: str, pip: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MissingPackage(f"this needs the package {module!r}: install it with `{pip}`")


def cached_folder(name_or_path: str) -> Path:
    """The cache folder of a bundled model or GGUF file (it may not exist yet)."""
    if name_or_path in BUNDLED:
        return cache_root() / "models" / name_or_path
    path = Path(name_or_path)
    return cache_root() / "models" / f"{path.stem}-{_gguf_key(path)}"


def ensure_converted(name_or_path: str, progress: bool = True) -> Path:
    """Return a verified fp32 safetensors folder for a bundled name or GGUF path.

    Converted once per cache: every process of a launch (torchrun starts several at once) takes the cache
    folder's file lock in turn; the first converts, the others find the verified folder and read it."""
    target = cached_folder(name_or_path)
    if _cache_valid(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if _cache_valid(target):  # converted by another process while this one waited
            return target
        _convert_once(name_or_path, target, progress)
    return target


def _convert_once(name_or_path: str, target: Path, progress: bool) -> None:
    tied = False
    if name_or_path in BUNDLED:
        bundled = BUNDLED[name_or_path]
        if progress and len(bundled.parts) > 1:
            logger.info("checking the %d parts of %s", len(bundled.parts), bundled.name)
        # joins split parts under the cache; a missing or damaged part raises, naming it
        gguf, tied = bundled.locate(cache_root()), bundled.tied
    else:
        gguf = Path(name_or_path)
    if progress:
        logger.info("converting %s to fp32 safetensors in %s (once; from 30 s to a few minutes)", gguf.name, target)
    _convert_gguf(gguf, target, tied=tied)
    if not _cache_valid(target):
        raise RuntimeError(f"cache folder {target} failed verification right after writing it; is the disk full?")


def _resolve(name_or_path: str) -> tuple[str, str]:
    """-> (kind, location) with kind in {'folder', 'hub'}, converting GGUF first."""
    if name_or_path in BUNDLED:
        return "folder", str(ensure_converted(name_or_path))
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFound(f"GGUF file {path} does not exist")
        return "folder", str(ensure_converted(str(path)))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"folder {path} has no config.json: it is not a Hugging Face model folder")
        return "folder", str(path)
    looks_like_hub_id = name_or_path.count("/") == 1 and not name_or_path.startswith((".", "/", "~"))
    if looks_like_hub_id:
        return "hub", name_or_path
    known = ", ".join(BUNDLED)
    raise ModelNotFound(
        f"unknown model {name_or_path!r}. Known names: {known}. "
        "Or pass a local Hugging Face model folder, a .gguf file, or a hub id like 'org/name' (online only)."
    )


def _exact_dtype(config, location, given: torch.dtype | None, default: torch.dtype) -> torch.dtype:
    """The dtype to load in: `default`, unless the config says the model is exact in one dtype only
    (`keyheads_exact_dtype`, as studies/compile_circuits.py writes for a tracr-compiled model, whose norm weights of
    2^25 and layer-norm epsilon of 2^50 overflow float16 and lose bits in bfloat16): then that one by default, and
    another given is refused."""
    exact = getattr(config, "keyheads_exact_dtype", None)
    if exact is None:
        return default
    if given is not None and given != getattr(torch, exact):
        raise SettingError(f"{location} is exact only in {exact} (its config's keyheads_exact_dtype: a compiled "
                           f"circuit's weights overflow or round in {str(given).removeprefix('torch.')}); load it "
                           f"with --dtype {exact}")
    return getattr(torch, exact)


def load_model(name_or_path: str = DEFAULT_MODEL, device: str | None = None, dtype: str | torch.dtype | None = None,
               attn_implementation: str | None = None, max_memory: str | dict | None = None,
               offload_folder: str | Path | None = None) -> HookedModel:
    """Load any supported causal LM as a HookedModel.

    Args:
        name_or_path: a bundled name (see ``keyheads models``), a .gguf file, a local
            Hugging Face model folder, or a hub id (needs a network).
        device: "cpu", "cuda", "cuda:1", "mps", or "auto" to shard with accelerate's
            device_map="auto". Default: cuda if available, else cpu.
        dtype: torch dtype or its name (float32, bfloat16, float16, float64 or fp32, bf16, fp16,
            fp64). Default: bfloat16 on GPU, float32 on CPU.
        attn_implementation: passed to transformers (default: its own choice; keyheads
            switches to eager only while attention patterns are read).
        max_memory: with device "auto", the most each device may hold, as accelerate's dict
            ({0: "20GiB", "cpu": "60GiB"}) or as text ("cuda:0=20GiB,cpu=60GiB").
        offload_folder: with device "auto", where the weights that max_memory leaves no room for
            go; accelerate loads each offloaded module's weights only during its own forward.
    """
    if (max_memory is not None or offload_folder is not None) and device != "auto":
        raise SettingError("max_memory and offload_folder place the parts of a model that accelerate dispatches: "
                           "they need device='auto'")
    if isinstance(max_memory, str):
        max_memory = parse_max_memory(max_memory)
    kind, location = _resolve(name_or_path)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if isinstance(dtype, str):  # the names keyheads.machine.DTYPES lists, checked against the device
        dtype = getattr(torch, check_dtype(dtype, device=device))
    given = dtype
    if dtype is None:  # device auto on a machine without a GPU places the model on the CPU
        on_cpu = device == "cpu" or device == "auto" and not torch.cuda.is_available()
        dtype = torch.float32 if on_cpu else torch.bfloat16
    try:
        config = AutoConfig.from_pretrained(location)
    except OSError as err:
        if kind == "hub":
            raise ModelNotFound(f"could not fetch {name_or_path!r} from the hub ({err}). Offline? "
                                f"Use a bundled name ({', '.join(BUNDLED)}) or a local folder.") from err
        raise BadFile(f"{location}: its config.json cannot be read ({_one_line(err)}); copy the model folder "
                      "again") from None
    family_for(config.model_type)  # fail early, naming the supported families
    dtype = _exact_dtype(config, location, given, dtype)
    kwargs = {"dtype": dtype}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if device == "auto":
        _require("accelerate", "pip install accelerate")
        kwargs["device_map"] = "auto"
        if max_memory is not None:
            kwargs["max_memory"] = max_memory
        if offload_folder is not None:
            kwargs["offload_folder"] = str(offload_folder)
    try:
        hf = AutoModelForCausalLM.from_pretrained(location, **kwargs)
    except (SafetensorError, OSError) as err:
        if kind == "hub":
            raise
        # a weights file cut short by a copy or a full disk, or another model's
        raise unreadable(location, err) from None
    if device != "auto":
        hf = hf.to(device)
    return HookedModel(hf, load_tokenizer(location), name=name_or_path, source=location)


@dataclass(frozen=True)
class Placement:
    """Where a model's weights are loaded (`load_on`) and where it computes (`run_on`)."""

    load_on: str
    run_on: str


def place(device: str | None = None, sharded: bool = False) -> Placement:
    """Where to load and where to compute: `device` (cpu, cuda, cuda:N, mps, auto), else under a launcher
    this process's own device, else a GPU when there is one. A model that FSDP2 will shard (`sharded`)
    over GPUs loads into host memory: each process then moves only its own shards to its GPU, so no GPU
    ever holds the whole model."""
    run = device or distributed.default_device() or ("cuda" if torch.cuda.is_available() else "cpu")
    if sharded and run.startswith("cuda"):
        return Placement("cpu", f"cuda:{torch.cuda.current_device()}" if run == "cuda" else run)
    return Placement(run, run)


def load_placed(name_or_path: str, device: str | None = None, dtype: str | None = None, *,
                max_memory: str | dict | None = None, offload_folder: str | Path | None = None,
                sharded: bool = False) -> tuple[HookedModel, Placement]:
    """The one way every command and stage loads its model: placed by `place`, in `dtype` (default: as
    load_model chooses for where it computes: bfloat16 on a GPU, float32 on the CPU). Returns the model and
    where it computes. A model that FSDP2 will shard (`sharded`) comes without its weights when they are
    safetensors files: FSDP2 shards it first, then each process reads only its own shards (finetune's FSDP)."""
    where = place(device, sharded)
    if dtype is None and where.load_on != where.run_on:  # loaded on the host to be sharded over GPUs
        dtype = "bfloat16"
    if sharded:
        kind, location = _resolve(name_or_path)
        if kind == "folder" and has_safetensors(location):
            return load_skeleton(name_or_path, location, dtype or "float32", where.run_on), where
        logger.warning("%s is not a folder of safetensors files: every process loads the whole model before FSDP2 "
                       "shards it (save it with save_pretrained to load only each process's shards)", name_or_path)
    model = load_model(name_or_path, device=where.load_on, dtype=dtype, max_memory=max_memory,
                       offload_folder=offload_folder)
    return model, where


def load_skeleton(name: str, folder: str, dtype: str | torch.dtype, run_on: str) -> HookedModel:
    """The model of `folder` without its weights (parameters on the meta device), for FSDP2 to shard
    before each process reads its own shards (keyheads.models.sharded)."""
    if isinstance(dtype, str):
        dtype = getattr(torch, check_dtype(dtype, device=run_on))
    family_for(AutoConfig.from_pretrained(folder).model_type)  # fail early, naming the supported families
    return HookedModel(skeleton(folder, dtype), load_tokenizer(folder), name=name, source=folder)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def load_tokenizer(folder: str | Path):
    """The tokenizer saved in a model folder, without its weights."""
    return AutoTokenizer.from_pretrained(str(folder))

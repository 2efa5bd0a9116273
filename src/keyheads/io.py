"""Writing results so that no run loses finished work: atomic files and JSONL."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from .errors import BadFile, MalformedLine, MissingFile, SettingError


def file_sha256(path: str | Path) -> str:
    """sha256 of a file, read in blocks (model weights can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary file name beside `path`, for a writer that takes a file name (safetensors):
    renamed over `path` when the block ends without an error, removed otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are for sharing, like any file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write to a temporary file in the same folder, fsync, then rename over `path`."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


def set_aside(path: Path) -> Path:
    """Where `atomic_folder(..., replace=True)` keeps the folder it replaces while it swaps."""
    return path.parent / f".old-{path.name}"


@contextmanager
def atomic_folder(path: str | Path, replace: bool = False) -> Iterator[Path]:
    """A temporary folder beside `path`, renamed to `path` when the block ends without an error
    (deleted otherwise), so a crash never leaves half a folder. An existing `path` raises
    FileExistsError, or with `replace` is first renamed to `set_aside(path)` and deleted after
    the swap; a crash between the two renames leaves it there for `restore_set_aside`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; a cached model or a run folder is for sharing
        old = set_aside(path)
        if path.exists():
            if not replace:
                raise FileExistsError(f"{path} exists")
            # a crash after an earlier swap's renames left `old`; renaming onto a non-empty folder fails
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def restore_set_aside(path: Path) -> None:
    """Undo a swap that a crash cut between its two renames: `path` is missing, its old copy is aside."""
    old = set_aside(path)
    if not path.exists() and old.exists():
        try:
            os.replace(old, path)
        except FileNotFoundError:  # another process of the same run restored it first
            pass


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def read_json(path: str | Path) -> Any:
    """The JSON in `path`; a file that is not JSON (truncated, or another format) is a BadFile naming it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadFile(f"{path} is not valid JSON ({err}): it is truncated or not the file expected; "
                      "write it again") from None


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> Path:
    return atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield (line_number, object); a malformed line raises an error naming it."""
    path = Path(path)
    if not path.is_file():
        raise MissingFile(f"{path} does not exist")
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:  # an image, an archive, a model file...
                raise MalformedLine(f"{path}:{number}: not UTF-8 text; is it a JSONL file (one JSON object a "
                                    "line)?") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise MalformedLine(f"{path}:{number}: not valid JSON ({err.msg})") from err
            if not isinstance(obj, dict):
                raise MalformedLine(f"{path}:{number}: expected a JSON object, got {type(obj).__name__}")
            yield number, obj


def read_jsonl(path: str | Path) -> list[dict]:
    return [obj for _, obj in iter_jsonl(path)]


def read_yaml(path: str | Path, what: str = "YAML file") -> Any:
    """The YAML document in `path` (None when empty): the one reader of YAML files given as input.

    A missing file is a MissingFile, a file that is not UTF-8 text or not valid YAML a BadFile, each
    naming the file in one line (the line and column where the YAML breaks)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFile(f"{what} {path} does not exist")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise BadFile(f"{path}: not UTF-8 text; a {what} is YAML text") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise BadFile(f"{path}: not valid YAML{at} ({problem}); fix that line") from None


def existing_file(key: str, path: str | None, hint: str = "") -> str | None:
    """`path` if it names a file (None passes): the check of every setting that names an input file."""
    if path is not None and not Path(path).is_file():
        raise SettingError(key, path, "no such file" + (f" ({hint})" if hint else ""))
    return path

"""A map over items whose finished results are kept in a checkpoint file, so that a stage stopped hours into
a large model continues where it stopped: the knockout curves' sets and the transfer table's sets use it."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..distributed import is_main, map_sharded
from ..errors import BadFile
from ..io import read_json, write_json

T = TypeVar("T")
R = TypeVar("R")


def resumable_map(compute: Callable[[list[T]], Sequence[R]], items: Sequence[T], path: Path, key: str, chunk: int,
                  *, encode: Callable[[R], Any] = lambda r: r, decode: Callable[[Any], R] = lambda v: v,
                  order: Callable[[Iterable[int]], list[int]] = sorted) -> list[R]:
    """compute(items) over every process (map_sharded), `chunk` items at a time; after each chunk the results
    so far are written to `path` under `key` (a string naming everything the results depend on), encoded for
    JSON by `encode`. Results found in `path` under the same key are read back by `decode` and not computed
    again; `order` sorts the indices still to compute (the order their chunks run in)."""
    try:  # a checkpoint only saves time: one that cannot be read is started over, not an error
        saved = read_json(path) if path.exists() else {}
        done = {int(i): decode(v) for i, v in saved["results"].items()} if saved["key"] == key else {}
    except (BadFile, AttributeError, KeyError, TypeError, ValueError):  # pydantic's ValidationError is a ValueError
        done = {}
    todo = order(i for i in range(len(items)) if i not in done)
    for c in range(0, len(todo), chunk):
        part = todo[c:c + chunk]
        done.update(zip(part, map_sharded(compute, [items[i] for i in part])))
        if is_main():
            write_json(path, {"key": key, "results": {str(i): encode(done[i]) for i in sorted(done)}})
    return [done[i] for i in range(len(items))]

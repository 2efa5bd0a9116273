"""Per-item result cache: an append-only JSONL file per benchmark.

Every finished batch is appended and flushed to disk, so an interrupted run loses at most
the batch in flight and a re-run only computes what is missing. A line cut short by a
crash (the last one) is dropped and cut from the file before anything is appended.
Several runs may share a cache folder at once: appends and the cut hold an exclusive
lock, each batch is one write, and `refresh` picks up what other runs appended.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable


def item_key(fingerprint: str, benchmark: str, prompt: str, settings: dict) -> str:
    """What makes a result reusable: the model, the benchmark, the exact prompt, the settings."""
    blob = json.dumps({"model": fingerprint, "benchmark": benchmark, "prompt": prompt, "settings": settings},
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResultCache:
    """key -> result row, backed by `path` (one JSON object per line, each with a "key")."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.rows: dict[str, dict] = {}
        self.offset = 0  # bytes of the file already read
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked() as fd:
            self._read(fd, cut_torn=True)

    @contextmanager
    def _locked(self):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # closing releases the lock

    def _read(self, fd: int, cut_torn: bool) -> None:
        size = os.fstat(fd).st_size
        data = os.pread(fd, size - self.offset, self.offset) if size > self.offset else b""
        end = data.rfind(b"\n") + 1  # only complete lines; a torn tail has no newline yet
        for number, line in enumerate(data[:end].split(b"\n")):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                self.rows[row["key"]] = row
            except (ValueError, KeyError, TypeError):
                print(f"[keyheads] {self.path}: skipping a malformed cache line", file=sys.stderr)
        self.offset += end
        if cut_torn and end < len(data):  # we hold the lock, so no writer is mid-line: a crash left it
            os.ftruncate(fd, self.offset)

    def refresh(self) -> None:
        """Read lines other runs appended since the last read."""
        with self._locked() as fd:
            self._read(fd, cut_torn=False)

    def get(self, key: str) -> dict | None:
        return self.rows.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self.rows

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: Iterable[dict]) -> None:
        rows = list(rows)
        if not rows:
            return
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
        with self._locked() as fd:
            self._read(fd, cut_torn=True)  # catch up (and drop a torn tail) before appending
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            self.offset += len(data)
        for r in rows:
            self.rows[r["key"]] = r

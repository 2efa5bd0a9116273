"""Per-item result cache: one SQLite database (WAL mode) per benchmark.

Every finished batch is committed in one transaction, so an interrupted run loses at most the
batch in flight and a re-run only computes what is missing. Several runs (and processes of one
distributed run) may share a cache folder at once: SQLite serialises the writers, readers never
block them, and `refresh` picks up what other runs committed since the last read.

Rows are only ever appended, in commit order (`seq`); the latest row of a key wins, as it did in
the JSONL files earlier versions wrote (a `<benchmark>.jsonl` beside a new database is imported
once, so those caches keep serving).
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path

from ..errors import MissingFile
from ..log import logger

SCHEMA = "CREATE TABLE IF NOT EXISTS rows (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, row TEXT NOT NULL)"
BUSY_SECONDS = 600.0  # how long a writer waits for another one (a batch commit takes milliseconds)


def item_key(fingerprint: str, benchmark: str, prompt: str, settings: dict) -> str:
    """What makes a result reusable: the model, the benchmark, the exact prompt, the settings."""
    blob = json.dumps({"model": fingerprint, "benchmark": benchmark, "prompt": prompt, "settings": settings},
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _connect(path: Path) -> sqlite3.Connection:
    # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE takes the write lock up front)
    db = sqlite3.connect(path, timeout=BUSY_SECONDS, isolation_level=None)
    # Switching a new database to WAL while another process opens it can fail at once with "database is
    # locked" (SQLite does not always call the busy handler there), so that step is retried.
    deadline = time.monotonic() + BUSY_SECONDS
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                db.close()
                raise
            time.sleep(0.05)
    db.execute("PRAGMA synchronous=FULL")  # a committed batch survives a power cut, as the fsync'd lines did
    return db


class ResultCache:
    """key -> result row (a dict with a "key"), backed by the SQLite database at `path`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.rows: dict[str, dict] = {}
        self.seq = 0  # the last row already read
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(_connect(self.path)) as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute(SCHEMA)
            if db.execute("SELECT seq FROM rows LIMIT 1").fetchone() is None:
                self._import_jsonl(db, self.path.with_suffix(".jsonl"))
            db.execute("COMMIT")
            self._read(db)

    def _import_jsonl(self, db: sqlite3.Connection, legacy: Path) -> None:
        if not legacy.is_file() or legacy == self.path:
            return
        rows = []
        for line in legacy.read_bytes().split(b"\n"):
            try:
                row = json.loads(line)
                rows.append((row["key"], json.dumps(row, ensure_ascii=False)))
            except (ValueError, KeyError, TypeError):  # an empty, torn or malformed line
                continue
        db.executemany("INSERT INTO rows (key, row) VALUES (?, ?)", rows)
        logger.info("%s: imported %d cached rows from %s", self.path, len(rows), legacy.name)

    def _read(self, db: sqlite3.Connection) -> None:
        for seq, key, row in db.execute("SELECT seq, key, row FROM rows WHERE seq > ? ORDER BY seq", (self.seq,)):
            try:
                self.rows[key] = json.loads(row)
            except ValueError:
                logger.warning("%s: skipping a malformed cache row", self.path)
            self.seq = seq

    def refresh(self) -> None:
        """Read the rows other runs committed since the last read."""
        with closing(_connect(self.path)) as db:
            self._read(db)

    def __getitem__(self, key: str) -> dict:
        return self.rows[key]

    def __contains__(self, key: str) -> bool:
        return key in self.rows

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: Iterable[dict]) -> None:
        """Append `rows` in one transaction (all or none of them are kept)."""
        rows = list(rows)
        if not rows:
            return
        values = [(r["key"], json.dumps(r, ensure_ascii=False)) for r in rows]
        with closing(_connect(self.path)) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany("INSERT INTO rows (key, row) VALUES (?, ?)", values)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            self._read(db)  # our rows and whatever others committed before them


def read_rows(path: str | Path) -> list[dict]:
    """Every row ever added to the cache at `path`, in commit order (a key added twice is there twice)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFile(f"{path} does not exist")
    with closing(sqlite3.connect(path, timeout=BUSY_SECONDS)) as db:
        return [json.loads(row) for (row,) in db.execute("SELECT row FROM rows ORDER BY seq")]

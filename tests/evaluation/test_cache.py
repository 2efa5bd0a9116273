"""The per-item result cache: several processes appending at once, what a reader sees, old JSONL caches."""
import json
import subprocess
import sys

import pytest

from keyheads.evaluation.cache import ResultCache, read_rows

WRITER = """
import sys
from keyheads.evaluation.cache import ResultCache
cache = ResultCache(sys.argv[1])
for b in range(int(sys.argv[3])):
    cache.add({"key": f"{sys.argv[2]}-{b}-{i}", "writer": sys.argv[2], "batch": b} for i in range(5))
"""


def test_processes_appending_at_once_lose_nothing(tmp_path):
    path = tmp_path / "c.sqlite"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(w), "20"]) for w in range(4)]
    assert [p.wait(timeout=120) for p in writers] == [0] * 4
    rows = read_rows(path)
    assert len(rows) == len({r["key"] for r in rows}) == 4 * 20 * 5
    for w in map(str, range(4)):  # each process's batches in its order, each batch whole
        mine = [r for r in rows if r["writer"] == w]
        assert [r["batch"] for r in mine] == sorted(r["batch"] for r in mine)
    cache = ResultCache(path)
    assert len(cache) == 400 and cache["3-19-4"] == {"key": "3-19-4", "writer": "3", "batch": 19}


def test_the_latest_row_of_a_key_wins_and_refresh_reads_only_what_is_new(tmp_path):
    a, b = ResultCache(tmp_path / "c.sqlite"), ResultCache(tmp_path / "c.sqlite")
    a.add([{"key": "k", "v": 1}, {"key": "j", "v": 0}])
    b.refresh()
    a.add([{"key": "k", "v": 2}])
    assert b["k"] == {"key": "k", "v": 1}
    b.refresh()
    assert b["k"] == {"key": "k", "v": 2} and len(b) == 2 and "j" in b
    assert [r["v"] for r in read_rows(tmp_path / "c.sqlite")] == [1, 0, 2]  # nothing is overwritten


def test_an_old_jsonl_cache_is_imported_once(tmp_path):
    rows = [{"key": "a", "output": "1"}, {"key": "b", "output": "2"}]
    (tmp_path / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"key": "c", "outp')
    cache = ResultCache(tmp_path / "gsm8k.sqlite")
    assert len(cache) == 2 and cache["b"] == rows[1]  # the torn last line is left out
    (tmp_path / "gsm8k.jsonl").write_text(json.dumps({"key": "z"}) + "\n")
    assert "z" not in ResultCache(tmp_path / "gsm8k.sqlite")  # only into an empty cache


def test_reading_a_missing_cache(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.sqlite does not exist"):
        read_rows(tmp_path / "nowhere.sqlite")


def test_a_database_locked_while_another_process_switches_it_to_wal_is_retried(tmp_path, monkeypatch):
    """SQLite can answer the WAL switch with "database is locked" at once while a peer opens the same new
    database; the cache waits and retries instead of failing the run. Other errors still raise."""
    import sqlite3

    import keyheads.evaluation.cache as cache_mod

    real = sqlite3.connect
    failures = {"left": 2, "message": "database is locked"}

    class Flaky:
        def __init__(self, db):
            self.db = db

        def execute(self, sql, *args):
            if sql.startswith("PRAGMA journal_mode") and failures["left"]:
                failures["left"] -= 1
                raise sqlite3.OperationalError(failures["message"])
            return self.db.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self.db, name)

    monkeypatch.setattr(cache_mod.sqlite3, "connect", lambda *a, **k: Flaky(real(*a, **k)))
    cache = ResultCache(tmp_path / "c.sqlite")
    cache.add([{"key": "k", "value": 1}])
    assert failures["left"] == 0 and ResultCache(tmp_path / "c.sqlite")["k"] == {"key": "k", "value": 1}
    failures.update(left=1, message="disk I/O error")
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        ResultCache(tmp_path / "d.sqlite")

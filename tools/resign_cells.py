"""Re-sign committed cell records after the way code is hashed changed, from the sources that made them.

A cell record keeps `commit` (the keyheads commit it ran at) and `code` (a hash per module it computed with,
keyheads.study.code). When the hashing itself changes (error messages blanked, for one), every signed cell would read
as stale though no statement changed. This tool recomputes each record's signature with today's hashing from the
module sources *at the record's commit* (git show), after checking that the hashing the record was signed with
(`--was`: the previous hashing, kept below) gives the recorded hashes from those same sources; a record whose check
fails is left as it is and named. Needs the repository's history (a full clone).

    python tools/resign_cells.py records/STUDY/cells [...]
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from keyheads.io import read_json, write_json
from keyheads.study import code

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "src/keyheads"


def hash_before_messages_were_blanked(text: str) -> str:
    """The hashing of cells signed before 2026-11-29: the syntax tree less docstrings, error messages counted."""
    return code.source_hash(text, blank_errors=False)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout


def sources_at(commit: str, stages: list[str]) -> dict[str, str]:
    """{module path relative to the package: its source at `commit`} of the modules the stages compute with."""
    paths = [p for e in code.entries(stages) for p in _git("ls-tree", "-r", "--name-only", commit,
                                                           f"{PACKAGE}/{e}").split()]
    return {p.removeprefix(PACKAGE + "/"): _git("show", f"{commit}:{p}") for p in paths
            if p.endswith(".py") and code.counted(Path(p).name)}


def resign(folder: Path) -> str:
    """Re-sign one cell record in place -> what was done."""
    meta = read_json(folder / "record.json")
    if "code" not in meta:
        return "unsigned, left"
    sources = sources_at(meta["commit"], meta["stages"])
    was = {m: hash_before_messages_were_blanked(t) for m, t in sources.items()}
    now = {m: code.source_hash(t) for m, t in sources.items()}
    signed = {m: h for m, h in meta["code"].items() if code.counted(Path(m).name)}  # settings modules: not code
    if signed == now:
        return "already signed with today's hashing"
    if signed != was:
        return f"LEFT: its signature is not of its commit {meta['commit'][:10]}'s sources"
    write_json(folder / "record.json", {**meta, "code": now})
    return "re-signed"


def main(argv: list[str]) -> int:
    if not argv or any(a.startswith("-") for a in argv):
        print(__doc__.strip().splitlines()[0] + "\nusage: python tools/resign_cells.py records/STUDY/cells [...]",
              file=sys.stderr)
        return 2
    for name in argv:
        cells = Path(name)
        records = sorted(cells.glob("*/record.json"))
        if not records:
            print(f"{cells}: no cell records (record.json in its folders)", file=sys.stderr)
            return 2
        for record in records:
            print(f"{record.parent}: {resign(record.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

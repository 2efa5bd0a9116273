"""Re-sign committed cell records after the way code is hashed changed, from the sources that made them; or after a
refactor, on a witness's word that it changed no number.

A cell record keeps `commit` (the keyheads commit it ran at) and `code` (a hash per module it computed with,
keyheads.study.code). When the hashing itself changes (error messages blanked, for one), every signed cell would read
as stale though no statement changed. This tool recomputes each record's signature with today's hashing from the
module sources *at the record's commit* (git show), after checking that the hashing the record was signed with
(`--was`: the previous hashing, kept below) gives the recorded hashes from those same sources; a record whose check
fails is left as it is and named. Needs the repository's history (a full clone).

    python tools/resign_cells.py records/STUDY/cells [...]

`--witness OLD` re-signs the cells whose signature is commit OLD's sources with the checkout's (HEAD, with no
uncommitted change in src/keyheads), when keyheads.study.witness holds: a tiny study of every kind of cell, on a
random model of each family the studies use, writes the same outputs with OLD's sources as with today's, and every
changed statement of the signed modules ran in it. Each record gets a `resigned` entry; nothing is written when the
witness does not hold, and the tool says which outputs differ or which changed lines it did not reach.

    python tools/resign_cells.py --witness OLD records/STUDY/cells [...]
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from keyheads.io import read_json, write_json
from keyheads.results.run import CellRecord, Resigned
from keyheads.study import code, witness

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "src/keyheads"
# SmolLM2 and Gemma-3's families. Qwen2.5-Coder's (qwen2) is not witnessed yet: its tiny model, saved and read
# back as a run reads it, rejects every generated pair (its tokenizer reads back otherwise); the Llama witness runs
# the same code but for the family file (families/qwen2.py), which a change there would need witnessed apart.
FAMILIES = ["llama", "gemma3"]


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


def signed_with(folder: Path, commit: str) -> CellRecord | None:
    """The cell's record when its signature is `commit`'s sources (today's hashing), else None."""
    meta = CellRecord.from_json(read_json(folder / "record.json"))
    if meta.code is None:
        return None
    then = {m: code.source_hash(t) for m, t in sources_at(commit, meta.stages).items()}
    return meta if {m: h for m, h in meta.code.items() if code.counted(Path(m).name)} == then else None


def resign_by_witness(old: str, folders: list[Path], work: Path) -> int:
    """Re-sign the cells signed with `old`'s sources, when the witness holds -> exit status."""
    old = _git("rev-parse", old).strip()
    head = _git("rev-parse", "HEAD").strip()
    if _git("status", "--porcelain", "--", PACKAGE).strip():
        print(f"{PACKAGE} has uncommitted changes: commit them first (a record names the commit it is signed at)",
              file=sys.stderr)
        return 2
    todo: dict[Path, CellRecord] = {}
    for folder in folders:
        meta = signed_with(folder, old)
        if CellRecord.from_json(read_json(folder / "record.json")).code is None:
            print(f"{folder}: unsigned (recorded before cells kept a signature), left")
        elif meta is None:
            print(f"{folder}: its signature is not {old[:10]}'s sources, left")
        elif code.changed(meta.code or {}, code.signature(meta.stages)):
            todo[folder] = meta
        else:
            print(f"{folder}: signed with today's code already")
    if not todo:
        return 0
    modules = sorted({m for meta in todo.values() for m in code.changed(meta.code or {}, code.signature(meta.stages))})
    print(f"{len(todo)} cell(s) to re-sign; changed modules: {', '.join(modules)}", flush=True)
    tree = work / "old"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(tree), old], check=True,
                   capture_output=True)
    try:
        changed = witness.changed_lines(ROOT, old, modules)
        outcome = witness.witness(tree / "src", ROOT / "src", work / "runs", FAMILIES, changed)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    if not outcome.holds:
        print(f"the witness does not hold ({outcome.compared} outputs compared): nothing re-signed", file=sys.stderr)
        for what, items in (("differs", outcome.differ), ("changed and not reached", outcome.unreached)):
            for item in items:
                print(f"  {what}: {item}", file=sys.stderr)
        return 1
    entry = Resigned(was=old, now=head, families=FAMILIES, compared=outcome.compared)
    for folder, meta in todo.items():
        again = meta.model_copy(update={"code": code.signature(meta.stages),
                                        "resigned": [*(meta.resigned or []), entry]})
        write_json(folder / "record.json", again.to_json() | {"code": again.code,
                                                               "resigned": [r.to_json() for r in again.resigned]})
        print(f"{folder}: re-signed at {head[:10]} ({outcome.compared} outputs equal)")
    return 0


def main(argv: list[str]) -> int:
    old = None
    if argv[:1] == ["--witness"] and len(argv) > 2:
        old, argv = argv[1], argv[2:]
    if not argv or any(a.startswith("-") for a in argv):
        print(__doc__.strip().splitlines()[0] + "\nusage: python tools/resign_cells.py [--witness OLD] "
              "records/STUDY/cells [...]", file=sys.stderr)
        return 2
    folders = []
    for name in argv:
        cells = Path(name)
        records = sorted(cells.glob("*/record.json"))
        if not records:
            print(f"{cells}: no cell records (record.json in its folders)", file=sys.stderr)
            return 2
        folders += [r.parent for r in records]
    if old is not None:
        with tempfile.TemporaryDirectory(prefix="witness-") as work:
            return resign_by_witness(old, folders, Path(work))
    for folder in folders:
        print(f"{folder}: {resign(folder)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""Atomic writes: a file or folder appears whole or not at all, and a crash mid-swap is undone."""
import os

import pytest

from keyheads.io import atomic_folder, atomic_path, atomic_write_text, restore_set_aside, set_aside


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_file_is_renamed_into_place_only_when_written(tmp_path):
    path = tmp_path / "a" / "x.bin"
    with atomic_path(path) as tmp:
        tmp.write_bytes(b"one")
        assert not path.exists() and tmp.parent == path.parent
    assert path.read_bytes() == b"one" and oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("crash")
    assert path.read_bytes() == b"one" and leftovers(path.parent) == []
    assert atomic_write_text(path, "two").read_text() == "two" and leftovers(path.parent) == []


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_folder_appears_whole_and_an_existing_one_is_kept_or_swapped(tmp_path):
    out = tmp_path / "model"
    with atomic_folder(out) as tmp:
        (tmp / "w").write_text("1")
        assert not out.exists()
    assert (out / "w").read_text() == "1"
    with pytest.raises(FileExistsError, match="model exists"):
        with atomic_folder(out) as tmp:
            (tmp / "w").write_text("2")
    assert (out / "w").read_text() == "1" and leftovers(tmp_path) == []
    with pytest.raises(RuntimeError):
        with atomic_folder(out, replace=True) as tmp:
            (tmp / "w").write_text("half")
            raise RuntimeError("crash")
    assert (out / "w").read_text() == "1" and leftovers(tmp_path) == []
    with atomic_folder(out, replace=True) as tmp:
        (tmp / "w").write_text("3")
    assert (out / "w").read_text() == "3" and leftovers(tmp_path) == []


def test_a_swap_cut_between_its_renames_is_restored(tmp_path):
    out = tmp_path / "checkpoint"
    out.mkdir()
    (out / "w").write_text("old")
    os.replace(out, set_aside(out))  # the first rename happened, the second did not
    restore_set_aside(out)
    assert (out / "w").read_text() == "old" and not set_aside(out).exists()
    restore_set_aside(out)  # nothing to do: a no-op
    assert (out / "w").read_text() == "old"


def test_a_truncated_json_file_is_a_bad_file_naming_it(tmp_path):
    from keyheads.errors import BadFile
    from keyheads.io import read_json, write_json

    path = write_json(tmp_path / "effects.json", {"heads": [[0.1, -0.2]], "mlps": [0.0]})
    path.write_text(path.read_text()[:12])
    with pytest.raises(BadFile, match="effects.json is not valid JSON"):
        read_json(path)

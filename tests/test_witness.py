"""keyheads.study.witness: a refactor that keeps every number is witnessed; one that changes a number, or changes a
statement the witness study never runs, is not."""
import shutil
from pathlib import Path

import pytest

from keyheads.study.witness import Outcome, compare, witness

# three runs of a tiny study per witness (and of the FSDP2 and circuit ones in the first, of a GGUF conversion in
# the second)
pytestmark = [pytest.mark.slow, pytest.mark.longest]

SRC = Path(__file__).resolve().parents[1] / "src"


def edited_copy(root: Path, edits: dict[str, tuple[str, str]]) -> tuple[Path, dict[str, set[int]]]:
    """A copy of the package with each module's `old` text replaced by `new` -> (its src folder, the changed lines
    as git diff would give them)."""
    src = root / "src"
    shutil.copytree(SRC / "keyheads", src / "keyheads", ignore=shutil.ignore_patterns("__pycache__"))
    changed = {}
    for module, (old, new) in edits.items():
        path = src / "keyheads" / module
        text = path.read_text()
        assert text.count(old) == 1, f"{old!r} is not once in {module}"
        path.write_text(text.replace(old, new))
        first = text[:text.index(old)].count("\n") + 1
        changed[module] = set(range(first, first + len(new.rstrip("\n").split("\n"))))
    return src, changed


def test_a_refactor_that_keeps_every_number_is_witnessed(tmp_path):
    src, changed = edited_copy(tmp_path / "new", {
        # the same value reached another way, on a line every identify runs (relative-logit, the default)
        "patching/metrics.py": ("        return (patched - original) / original\n",
                                "        change = patched - original\n        return change / original\n"),
        # a line only a fine-tune under FSDP2 runs (the sharded loading): its study reaches it
        "models/sharded.py": ("    reader = PlainReader(str(folder))\n",
                              "    reader = PlainReader(str(Path(folder)))\n"),
        # a line only identify from a circuit graph runs: the circuit probe reaches it
        "patching/from_circuit.py": ("    path, out = Path(path), Path(out)\n",
                                     "    path = Path(path)\n    out = Path(out)\n")})
    outcome = witness(SRC, src, tmp_path / "work", ["llama"], changed, probes=("circuit",), gguf=False)
    assert outcome.compared > 50 and outcome.differ == [] and outcome.unreached == []
    assert outcome.holds


def test_a_changed_number_or_an_unreached_statement_is_not(tmp_path):
    src, changed = edited_copy(tmp_path / "new", {
        "patching/metrics.py": ("        return (patched - original) / original\n",
                                "        return 2 * (patched - original) / original\n"),
        # a branch the witness study never takes (it asks for no GPU)
        "machine.py": ("from __future__ import annotations\n",
                       "from __future__ import annotations\n\n\ndef _never_called():\n    return 1\n"),
        # a converted GGUF's weights file that is no longer the one transformers writes (its metadata)
        "models/streamed_gguf.py": ('{"__metadata__": {"format": "pt"}}',
                                    '{"__metadata__": {"format": "pt", "by": "hand"}}')})
    outcome = witness(SRC, src, tmp_path / "work", ["llama"], changed, fsdp=False, probes=())
    assert any(d.startswith("identify/effects.json") for d in outcome.differ), outcome.differ
    assert any(d.endswith("model.safetensors:metadata.by") for d in outcome.differ), outcome.differ
    assert [u for u in outcome.unreached if u.startswith("machine.py:")], outcome.unreached
    assert not outcome.holds


def test_what_two_runs_of_one_code_disagree_on_is_left_out_and_a_time_always():
    old = {"a.json": {"acc": 0.5, "seconds": 1.0, "path": "/x"}, "b.bin": "11"}
    new = {"a.json": {"acc": 0.5, "seconds": 2.0, "path": "/y"}, "b.bin": "11"}
    again = {"a.json": {"acc": 0.5, "seconds": 2.0, "path": "/z"}, "b.bin": "11"}
    outcome = Outcome()
    compare(old, new, again, outcome)
    assert outcome.compared == 2 and outcome.differ == [] and outcome.volatile == ["a.json:path"]
    compare(old, {**new, "a.json": {**new["a.json"], "acc": 0.75}}, {**again, "a.json": {**again["a.json"],
                                                                                          "acc": 0.75}}, outcome)
    assert outcome.differ == ["a.json:acc"]
    nan = float("nan")
    outcome = Outcome()
    compare({"c.json": [nan]}, {"c.json": [nan]}, {"c.json": [nan]}, outcome)
    assert outcome.differ == [] and outcome.volatile == []

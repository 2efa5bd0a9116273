"""Test data shared by several test packages: pairs files and effects files for the tiny character-level
models, and a hand-made benchmark folder in the original formats (keyheads.testing builds the models); an
in-memory model as an evaluation variant. The direct reference computations are in keyheads.testing.oracles.

Test modules import these from here; conftest files hold only fixtures.
"""
import csv
import importlib.util
import json
import random
import sys
import types
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from keyheads.evaluation import EvalSettings, evaluate
from keyheads.evaluation.variants import Prepared
from keyheads.models.fingerprint import parameters_fingerprint, short_sha
from keyheads.models.model import HookedModel


def load_script(path: Path, name: str) -> types.ModuleType:
    """A script of tools/ (not a package) imported as module `name`, as its tests need it; bench/ and studies/
    are packages, imported as bench.NAME and studies.NAME."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


PREFIX = "1 + 2 = 3\n"  # 10 tokens; A is the 11th


def make_rows(n: int = 24, seed: int = 0, ops=(("addition", "+", "@"), ("subtraction", "-", "#"))):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        task, op, cf_op = ops[i % len(ops)]
        a, b = rng.randint(5, 9), rng.randint(1, 4)
        c = a + b if op == "+" else a - b
        ref = f"{PREFIX}{a} {op} {b} = "
        rows.append({"task": task, "template": f"{task[:3]}-eq", "reference": ref,
                     "counterfactual": ref.replace(f" {op} ", f" {cf_op} ", 1), "answer": str(c)[0],
                     "operands": {"A": str(a), "B": str(b)},
                     "positions": {"A": len(PREFIX), "B": len(PREFIX) + 4, "operator": len(PREFIX) + 2}})
    return rows


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_effects(path, heads, mlps=None):
    path.write_text(json.dumps({"metric": "relative-logit", "method": "path", "model": "tiny", "n_samples": 4,
                                "n_excluded": 0, "data_sha256": "x", "heads": heads,
                                "mlps": mlps if mlps is not None else [0.0] * len(heads)}))
    return path


MATH = [  # (question, worked solution, answer)
    ("Tom has 2 cats and 3 dogs. How many pets?", "2+3=<<2+3=5>>5", "5"),
    ("Ann has 4 pens and buys 3. How many now?", "4+3=<<4+3=7>>7", "7"),
    ("A box holds 6 eggs. How many in 2 boxes?", "6*2=<<6*2=12>>12", "12"),
    ("Sam had 9 cards and lost 4. How many left?", "9-4=<<9-4=5>>5", "5"),
    ("Kim reads 8 pages a day. Pages in 3 days?", "8*3=<<8*3=24>>24", "24"),
    ("Joe has 1,200 coins and 300 more. Total?", "1200+300=<<1200+300=1500>>1500", "1,500"),
]
CHOICE = [  # (question, choices, label)
    ("2+2?", ["3", "4", "5", "6"], 1), ("Sky colour?", ["red", "blue", "green", "gold"], 1),
    ("5-3?", ["2", "1", "0", "9"], 0), ("Ice is?", ["hot", "wet", "cold", "loud"], 2),
    ("1*7?", ["1", "8", "6", "7"], 3), ("Sun is a?", ["star", "moon", "rock", "tree"], 0),
]


def write_tiny_benchmarks(root, mmlu_subjects: tuple[str, str] = ("math", "science")):
    """A data folder of every benchmark, a few items each, small enough for tiny random models; MMLU has two
    subjects (name real ones, e.g. formal_logic and astronomy, for the MMLU categories)."""
    (root / "gsm8k").mkdir()
    for split, rows in (("train", MATH[:3]), ("test", MATH)):
        with open(root / "gsm8k" / f"{split}.jsonl", "w") as f:
            for q, sol, a in rows:
                f.write(json.dumps({"question": q, "answer": f"{sol}\n#### {a}"}) + "\n")
    plain = [(q, float(a.replace(",", ""))) for q, _, a in MATH]
    for name, file in (("addsub", "AddSub.json"), ("singleeq", "questions.json")):
        (root / name).mkdir()
        (root / name / file).write_text(json.dumps(
            [{"iIndex": i, "sQuestion": q, "lEquations": [f"X={a}"], "lSolutions": [str(a)]}
             for i, (q, a) in enumerate(plain)]))
    (root / "svamp").mkdir()
    (root / "svamp" / "SVAMP.json").write_text(json.dumps(
        [{"ID": f"chal-{i}", "Body": q.split(". ")[0] + ".", "Question": q.split(". ")[-1], "Equation": str(a),
          "Answer": a, "Type": "Addition"} for i, (q, a) in enumerate(plain)]))
    first, second = mmlu_subjects
    for split, subjects in (("dev", {first: CHOICE[:2], second: CHOICE[2:4]}),
                            ("test", {first: CHOICE[:3], second: CHOICE[3:]})):
        (root / "mmlu" / split).mkdir(parents=True)
        for subject, rows in subjects.items():
            with open(root / "mmlu" / split / f"{subject}_{split}.csv", "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["question", "choice0", "choice1", "choice2", "choice3", "answer"])
                for q, ch, label in rows:
                    writer.writerow([q, *ch, label])
    (root / "csqa").mkdir()
    for split, rows in (("train", CHOICE + CHOICE), ("dev", CHOICE)):
        with open(root / "csqa" / f"{split}_rand_split.jsonl", "w") as f:
            for i, (q, ch, label) in enumerate(rows):
                choices = [{"label": "ABCDE"[j], "text": t} for j, t in enumerate(ch + ["none"])]
                # train rows cycle their answers through A-E so balanced exemplars exist
                key = "ABCDE"[i % 5] if split == "train" else "ABCD"[label]
                f.write(json.dumps({"id": f"{split}{i}", "answerKey": key,
                                    "question": {"stem": q, "choices": choices}}) + "\n")
    return root


def assert_json_close(got, want, tol: float, where: str = "") -> None:
    """Equal JSON-like values: floats within `tol`, everything else (text, keys, lengths) exactly."""
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), where
        for k in want:
            assert_json_close(got[k], want[k], tol, f"{where}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_json_close(g, w, tol, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=tol), (where, got, want)
    else:
        assert got == want, (where, got, want)


def prepared(model: HookedModel, label: str | None = None) -> Prepared:
    """An in-memory model as an evaluation variant; its fingerprint hashes the parameters themselves."""
    return Prepared.of(model, {}, short_sha(parameters_fingerprint(model)), label or model.name)


class Killed(RuntimeError):
    """Stands for the process dying."""


def at_optimizer_step(monkeypatch, n: int, action) -> None:
    """The n-th optimizer step (1-based) of the next training run calls `action()` before it updates anything."""
    import keyheads.finetune.train as train_mod

    real = train_mod.make_optimizer

    def make(tuned, cfg):
        optimizer = real(tuned, cfg)
        step, calls = optimizer.step, [0]

        def hooked_step(self, *args, **kwargs):
            calls[0] += 1
            if calls[0] == n:
                action()
            return step(*args, **kwargs)

        optimizer.step = types.MethodType(hooked_step, optimizer)  # the LR scheduler wants a bound method
        return optimizer

    monkeypatch.setattr(train_mod, "make_optimizer", make)


def kill_at_optimizer_step(monkeypatch, n: int, error: type[BaseException] = Killed) -> None:
    """The n-th optimizer step (1-based) of the next training run raises `error` (Killed: the process dying;
    KeyboardInterrupt: Ctrl-C) before it updates anything."""

    def die() -> None:
        raise error(f"killed in optimizer step {n}")

    at_optimizer_step(monkeypatch, n, die)


class Evaluation(NamedTuple):
    """An evaluation's settings, and the caller's arguments of `evaluate` (data, batch, cache, progress, shard)."""

    settings: Any
    work: dict


def evaluation(data_dir=None, cache_dir=None, **kw) -> Evaluation:
    """EvalSettings from `kw`'s settings, the rest (batch_size, progress, shard) as the caller's arguments."""
    caller = {k: kw.pop(k) for k in ("batch_size", "progress", "shard") if k in kw}
    work = {"data_dir": None if data_dir is None else str(data_dir),
            "cache_dir": None if cache_dir is None else str(cache_dir), **caller}
    return Evaluation(EvalSettings(**kw), work)


def run_evaluation(variants, cfg: Evaluation, out, **kw):
    """`evaluate` with an Evaluation's settings and arguments."""
    return evaluate(variants, cfg.settings, out, **{**cfg.work, **kw})

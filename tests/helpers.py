"""Test data shared by several test packages: pairs files and effects files for the tiny character-level
models, and a hand-made benchmark folder in the original formats (keyheads.testing builds the models); an
in-memory model as an evaluation variant. The direct reference computations are in keyheads.testing.oracles.

Test modules import these from here; conftest files hold only fixtures.
"""
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
from keyheads.testing.benchmarks import CHOICE, MATH, write_tiny_benchmarks  # noqa: F401 (tests import them here)


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
    # the rows as results.json holds them, which the tests read
    return [row.to_json() for row in evaluate(variants, cfg.settings, out, **{**cfg.work, **kw})]

"""The modules that only read files or settings load without torch and transformers (seconds and memory): a
run folder copied to a laptop renders there, and the package's version, settings and machine checks load
without a model library.

Each module is imported in a fresh interpreter, since this one has torch loaded already. keyheads.runconfig
and keyheads.config.commands are not among them: they compose every step's settings, and each step's
settings class lives beside its code (README "Architecture"), in modules that import torch.
"""
import subprocess
import sys

import pytest

TORCH_FREE = [
    "keyheads",  # its model names load on first use
    "keyheads.runfolder",
    "keyheads.report",
    "keyheads.report.html",
    "keyheads.config",
    "keyheads.config.base",  # the machine fields: torch only when a check of a GPU runs
    "keyheads.settings",
    "keyheads.evaluation.config",  # the benchmark names the report shows
]
HEAVY = ("torch", "transformers")


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_without_torch(module):
    code = (f"import importlib, sys; importlib.import_module({module!r}); "
            f"print(' '.join(name for name in {HEAVY!r} if name in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"import {module} loads {done.stdout.strip()}"

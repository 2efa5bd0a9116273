"""The modules that only read files or settings load without torch and transformers (seconds and memory): a
run folder copied to a laptop renders there, and the package's version, settings and machine checks load
without a model library.

Each module is imported in a fresh interpreter, since this one has torch loaded already. keyheads.config.run
and keyheads.config.commands compose every step's settings: each step's settings class lives beside its code
(README "Architecture") in a module of its own that loads without torch (analysis.settings, data.settings,
patching.settings, finetune.settings, evaluation.settings), and the packages that hold them load their
torch-bound names on first use (keyheads.lazy).
"""
import importlib
import pkgutil
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
    "keyheads.machine",
    "keyheads.evaluation.settings",  # the benchmark names the report shows
    "keyheads.config.run",  # a run's config validates without a model library
    "keyheads.config.commands",
    "keyheads.analysis.settings",
    "keyheads.selection",  # HeadChoice, ComponentChoice
    "keyheads.circuits",  # MIB / EAP-IG graphs and TransformerLens hook names
    "keyheads.commands.export",  # torch only when a model's config is read
    "keyheads.data.settings",
    "keyheads.patching.settings",
    "keyheads.finetune.settings",
    "keyheads.models.bundled",  # DEFAULT_MODEL
]
HEAVY = ("torch", "transformers")


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_without_torch(module):
    code = (f"import importlib, sys; importlib.import_module({module!r}); "
            f"print(' '.join(name for name in {HEAVY!r} if name in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"import {module} loads {done.stdout.strip()}"


# the packages whose public names load on first use (keyheads.lazy)
LAZY_PACKAGES = ["keyheads", "keyheads.evaluation", "keyheads.finetune", "keyheads.models", "keyheads.patching"]


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_no_name_loaded_on_first_use_is_a_submodule(package):
    """Importing a submodule binds its name in the package: a public function of the same name (the function
    keyheads.patching.identify and a module patching/identify.py) would then be the module."""
    module = importlib.import_module(package)
    submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
    assert not submodules & set(module.__all__)


def test_the_parser_builds_without_the_libraries_a_stage_loads():
    """Every command builds the whole parser, which imports every command module: torch and transformers there
    would cost every `--help` and every flag's error seconds, and scipy.stats, statsmodels and matplotlib every
    start about two more, also a resumed stage's that draws nothing (keyheads.commands imports a stage's code
    when the command runs; pyproject bans the last three at module level)."""
    code = ("import sys, keyheads.cli; keyheads.cli.build_parser(); "
            f"print(' '.join(m for m in {HEAVY + ('scipy.stats', 'statsmodels', 'matplotlib')!r} "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"building the parser loads {done.stdout.strip()}"


def test_a_bad_flag_is_said_before_the_stage_loads():
    """A command checks its settings before it imports its stage's code (and torch with it)."""
    code = ("import sys, keyheads.cli; rc = keyheads.cli.main(['knockout', '--heads', '1.2']); "
            f"print(rc, ' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "--data" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout.split() == ["2"], f"a bad flag loaded {done.stdout.split()[1:]}"

"""The scripts of bench/ and studies/ use only keyheads' public API: none imports a private name (`_name`) of the
package or from a private module, or reaches one as an attribute, and none imports anything from `tests` (what
scripts and tests share lives in keyheads.testing). Read from each script's syntax tree, nothing is imported."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = (ROOT / "bench", ROOT / "studies")


def private(name: str) -> bool:
    """`_name`, but not a dunder such as `__version__`."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def package(module: str) -> bool:
    return module == "keyheads" or module.startswith("keyheads.")


def from_tests(module: str) -> bool:
    return module == "tests" or module.startswith("tests.")


def root_name(node: ast.expr) -> str | None:
    """`a` of `a.b.c`."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def script_problems(path: Path) -> list[str]:
    """What one script takes from past the public API, as 'NAME:LINE: what'."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[str] = []
    keyheads_names: set[str] = set()  # names bound to a keyheads module or object, for attribute use

    def problem(node: ast.AST, what: str) -> None:
        found.append(f"{path.name}:{node.lineno}: {what}")

    def imported(node: ast.AST, module: str, name: str | None = None) -> None:
        full = f"{module}.{name}" if name else module
        if from_tests(module):
            problem(node, f"imports {full} from tests")
        elif package(module) and any(private(part) for part in full.split(".")):
            problem(node, f"imports the private {full}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported(node, alias.name)
                if package(alias.name):
                    keyheads_names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imported(node, node.module, alias.name)
                if package(node.module):
                    keyheads_names.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and root_name(node) in keyheads_names:
            problem(node, f"uses the private {ast.unparse(node)}")
        elif isinstance(node, ast.Call):  # getattr(io, "_x"), importlib.import_module("tests.helpers")
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            text = [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else "" for a in node.args]
            if (func in ("getattr", "setattr", "hasattr", "delattr") and len(text) > 1 and private(text[1])
                    and root_name(node.args[0]) in keyheads_names):
                problem(node, f"uses the private {ast.unparse(node.args[0])}.{text[1]}")
            elif func in ("import_module", "__import__") and text and text[0]:
                imported(node, text[0])
    return sorted(found, key=lambda p: int(p.split(":")[1]))


def problems(folder: Path) -> list[str]:
    """script_problems of every .py in `folder`."""
    return [p for path in sorted(folder.glob("*.py")) for p in script_problems(path)]


def test_no_bench_or_study_script_imports_a_private_name_or_tests():
    for folder in FOLDERS:
        assert len(list(folder.glob("*.py"))) >= 5, f"no scripts found in {folder}"
    assert [p for folder in FOLDERS for p in problems(folder)] == []


def test_the_check_finds_each_way_past_the_public_api(tmp_path):
    (tmp_path / "bad.py").write_text('''import importlib
import keyheads.finetune.train as train_mod
import tests.helpers
from keyheads._private import thing
from keyheads.evaluation.runner import _batches, batches
from keyheads import io
from tests.report.test_stats import fake_eval

train_mod._make_optimizer = None
io._umask()
getattr(io, "_umask")
importlib.import_module("tests.helpers")
''')
    (tmp_path / "good.py").write_text('''import keyheads
import keyheads.finetune.train as train_mod
from keyheads.io import atomic_write_text


def _mine(x):
    return x._private, keyheads.__version__, train_mod.make_optimizer, getattr(x, "_y")
''')
    assert problems(tmp_path) == [
        "bad.py:3: imports tests.helpers from tests",
        "bad.py:4: imports the private keyheads._private.thing",
        "bad.py:5: imports the private keyheads.evaluation.runner._batches",
        "bad.py:7: imports tests.report.test_stats.fake_eval from tests",
        "bad.py:9: uses the private train_mod._make_optimizer",
        "bad.py:10: uses the private io._umask",
        "bad.py:11: uses the private io._umask",
        "bad.py:12: imports tests.helpers from tests",
    ]

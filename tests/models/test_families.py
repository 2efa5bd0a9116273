"""Adding a family is adding a file: the registry and the tiny test models come from the files alone."""
import sys
from pathlib import Path

import pytest

from keyheads.models import families
from keyheads.testing import TINY_FAMILIES, tiny_model

NEW_FAMILY = '''
from dataclasses import replace

from .llama import FAMILY as LLAMA
from .llama import TINY

FAMILY = replace(LLAMA, name="zeta", model_types=("zeta",))
TINY = {"zeta": TINY["llama"]}
'''


@pytest.fixture
def extra_folder(tmp_path, monkeypatch):
    """A second folder of the families package, as if a file had been added to it."""
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith(f"{families.__name__}.zeta")]:
        del sys.modules[name]


def test_every_family_file_is_registered_with_a_tiny_model():
    files = {p.stem for p in Path(families.__file__).parent.glob("*.py")} - {"__init__", "base"}
    assert {f.name for f in families.FAMILIES} == files
    assert files <= set(TINY_FAMILIES) and "gpt_neox_serial" in TINY_FAMILIES


def test_a_new_file_is_found_with_no_other_edit(extra_folder):
    (extra_folder / "zeta.py").write_text(NEW_FAMILY)
    modules = families._family_modules()
    assert [m.FAMILY.name for m in modules][-1] == "zeta"
    assert "zeta" in families._tiny_configs(modules)


@pytest.mark.parametrize("body, missing", [("FAMILY = None\n", "TINY"), ("TINY = {}\n", "FAMILY")])
def test_a_family_file_without_its_names_is_refused(extra_folder, body, missing):
    (extra_folder / "zeta.py").write_text(body)
    with pytest.raises(TypeError, match=f"zeta.py must define {missing}"):
        families._family_modules()


def test_a_tiny_name_defined_twice_is_refused(extra_folder):
    (extra_folder / "zeta.py").write_text("from .llama import FAMILY, TINY\n")
    with pytest.raises(TypeError, match="'llama' is defined twice"):
        families._tiny_configs(families._family_modules())


def test_an_unknown_tiny_model_names_the_known_ones():
    with pytest.raises(families.UnsupportedArchitecture, match="'bert'.*gpt_neox_serial"):
        tiny_model("bert")

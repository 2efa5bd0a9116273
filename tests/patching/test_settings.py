"""The patching settings (torch-free) and the sweep (torch) name the same methods."""
import pytest
from pydantic import ValidationError

from keyheads.patching import PATCH_METHODS, IdentifySettings
from keyheads.patching.settings import METHODS


def test_settings_name_every_method_of_the_sweep():
    assert tuple(PATCH_METHODS) == METHODS
    for method in METHODS:
        assert IdentifySettings(method=method).method == method
    with pytest.raises(ValidationError,
                       match="valid methods are path, activation, attribution, attribution-ig, path-naive"):
        IdentifySettings(method="nope")

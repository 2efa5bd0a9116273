"""The registry of supported model families: one module per family, found by listing this package.

A new family is a new file here (see base.py for what it defines); nothing else lists the families.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from types import ModuleType

from ...errors import UnsupportedArchitecture
from .base import Family


def _family_modules() -> tuple[ModuleType, ...]:
    """Every module of this package except base, in file-name order."""
    names = sorted(info.name for info in pkgutil.iter_modules(__path__) if info.name != "base")
    modules = tuple(importlib.import_module(f"{__name__}.{name}") for name in names)
    for module in modules:
        missing = [attr for attr in ("FAMILY", "TINY") if not hasattr(module, attr)]
        if missing:  # a mistake in keyheads itself, not in the user's input
            raise TypeError(f"{module.__file__} must define {' and '.join(missing)} (see families/base.py)")
    return modules


def _tiny_configs(modules) -> dict[str, Callable]:
    configs: dict[str, Callable] = {}
    for module in modules:
        for name, make in module.TINY.items():
            if name in configs:
                raise TypeError(f"tiny model {name!r} is defined twice; {module.__file__} must rename it")
            configs[name] = make
    return configs


_MODULES = _family_modules()
FAMILIES: tuple[Family, ...] = tuple(m.FAMILY for m in _MODULES)
# keyheads.testing's tiny models: name -> callable(**common) -> transformers config.
TINY_CONFIGS: dict[str, Callable] = _tiny_configs(_MODULES)


def family_for(model_type: str) -> Family:
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    supported = ", ".join(f"{f.name} ({'/'.join(f.model_types)})" for f in FAMILIES)
    raise UnsupportedArchitecture(
        f"model_type {model_type!r} is not supported. Supported families: {supported}. "
        "A new family is one file in keyheads/models/families/."
    )


__all__ = ["FAMILIES", "TINY_CONFIGS", "Family", "family_for", "UnsupportedArchitecture"]

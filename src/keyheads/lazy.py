"""Public names a package loads on first use (PEP 562), so that importing the package stays light: the
report, the run folder and the settings load without torch and transformers."""
from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, names: dict[str, str], namespace: dict[str, Any],
               public: list[str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for `package`: each of `names` (public name -> the relative module that
    defines it) is imported when first asked for, then kept in `namespace` as an ordinary attribute. A
    submodule not imported yet is imported when asked for as an attribute (`package.loading`), as it was
    there when the package imported it itself."""

    def getattr_(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name], package), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(public))

    return getattr_, dir_

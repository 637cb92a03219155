"""Lazy exports for a package's ``__init__`` (PEP 562): a public name is imported from its module when first
used, so that ``import workbench`` imports no torch and ``import workbench.figures`` no figure module."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy(package: str, names: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: each of ``names`` (public name -> its module) imported on first use and
    kept in the package's ``namespace``."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name]), name)
        namespace[name] = value
        return value

    return __getattr__

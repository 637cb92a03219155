"""The Megatron Core releases the workbench trains with: the range CI tests (docs/environments.md).

``pyproject.toml`` declares the same range for the ``train`` extra (a test keeps the two equal). A release
outside it is refused in one line where training starts (``workbench run``, ``record(...)``), before any
rank does work: the CPU compatibility layer and the recorder's hooks are tested against these releases only.
Reading stores never asks which Megatron Core is installed.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

from workbench.errors import UnsupportedError

MEGATRON_CORE = ">=0.16.1,<0.20"
"""The supported megatron-core releases, as pip spells the range."""
_FLOOR = (0, 16, 1)
_BELOW = (0, 20)


def megatron_core_version() -> str | None:
    """The version of the megatron-core this process imported, else the installed one; None if none is."""
    imported = sys.modules.get("megatron.core")
    if imported is not None and isinstance(getattr(imported, "__version__", None), str):
        return str(imported.__version__)
    try:
        return importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...] | None:
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    return tuple(int(part or 0) for part in match.groups()) if match else None


def check_megatron_core(version: str | None = None) -> str:
    """``version`` (default: this process's megatron-core) if it is in the supported range; otherwise raise
    ``UnsupportedError`` in one line naming the range."""
    found = megatron_core_version() if version is None else version
    if found is None:
        raise UnsupportedError(f"megatron-core is not installed: training needs megatron-core{MEGATRON_CORE} "
                               "(pip install 'workbench[train]')")
    release = _release(found)
    if release is None or not _FLOOR <= release < _BELOW:
        raise UnsupportedError(f"megatron-core {found} is outside the supported range {MEGATRON_CORE}; install "
                               f"one inside it (pip install 'megatron-core{MEGATRON_CORE}')")
    return found

"""Names that become file names, and the folders that every path made from one must stay inside.

A run's name comes from a config, a study, an imported manifest or an importer's flag: from any file someone
else wrote. The workbench joins it to a folder it was given (``--out / name``), writes there and, with
``--overwrite``, deletes there. So a name is checked where it enters, and a path where it is written or deleted:

    name_problem("..")                  why a string cannot name a run, a study, a site's file or an import
    check_name(value, "name", where)    the name, or ``ConfigError`` (or the class asked for) in one line
    inside(folder, path)                ``path``, or ``ArgumentError`` unless it resolves to a place in ``folder``

A name is one path segment: not empty, not ``.`` or ``..``, no ``/``, ``\\`` or NUL, at most ``MAX_NAME_BYTES``
bytes in UTF-8 (the limit of a file name on Linux's and macOS's file systems). Other control characters pass:
every name is printed escaped (``cli.terminal_safe``).
Imports nothing beyond the standard library and the errors.
"""

from __future__ import annotations

import os
from pathlib import Path

from workbench.errors import ArgumentError, ConfigError, WorkbenchError

MAX_NAME_BYTES = 255
"""The longest name, in bytes of UTF-8: a file name's limit (``NAME_MAX``) on ext4, XFS, APFS and tmpfs."""

RULE = "one folder name: not '.' or '..', no '/', '\\\\' or NUL, at most 255 bytes"


def name_problem(value: object) -> str | None:
    """Why ``value`` cannot name a run, a study or a site's file; None when it can."""
    if not isinstance(value, str):
        return f"a {type(value).__name__}, not a string"
    if value in ("", ".", ".."):
        return "empty" if value == "" else f"{value!r} names a folder, not a run"
    if "/" in value or "\\" in value:
        return "it holds a path separator"
    if "\x00" in value:
        return "it holds a NUL"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not valid Unicode (a lone surrogate)"
    if size > MAX_NAME_BYTES:
        return f"{size} bytes long (at most {MAX_NAME_BYTES})"
    return None


def check_name(value: object, what: str, where: str | None = None,
               error: type[WorkbenchError] = ConfigError) -> str:
    """``value`` when it can name a file; else ``error`` naming ``where`` (the file or flag), ``what`` (the
    field) and the rule, in one line (the value escaped: it may hold control characters)."""
    problem = name_problem(value)
    if problem is not None:
        shown = value.encode("unicode_escape").decode("ascii")[:80] if isinstance(value, str) else repr(value)
        prefix = f"{where}: " if where else ""
        raise error(f"{prefix}{what} = '{shown}' is not allowed ({problem}): {RULE}")
    assert isinstance(value, str)
    return value


def inside(folder: str | os.PathLike[str], path: str | os.PathLike[str], what: str = "path") -> Path:
    """``path`` (as given) when, resolved (links followed), it lies inside ``folder`` resolved (``folder`` itself
    excluded); else ``ArgumentError``. Called where a file is written or deleted, not only where the name is read."""
    root = Path(folder).resolve()
    target = Path(path).resolve()
    if target == root or root not in target.parents:
        raise ArgumentError(f"{what} {path} lies outside {folder} (it resolves to {target}); the workbench writes "
                            f"and deletes only inside the folder it was given")
    return Path(path)

"""Writing files whole or not at all, and a full disk said in one line.

A report, a figure, a golden file or an import that meets a full disk (or a quota, or a read-only folder) must
not leave a 0-byte file, a folder it made, or a traceback. Every writer of a whole file goes through
``written(path)``, and every writer of a folder through ``made(folder)``:

    with written(Path("r.html"), needed=len(text)) as partial:    # writes r.html.partial-PID, renamed at the end
        partial.write_text(text)
    with made(Path("out/figures")):                               # folders made here are removed if the block fails
        ...
    no_room(err, path, needed)                                     # the one-line ``DiskFullError`` of an OSError

``DiskFullError`` is a ``WorkbenchError`` and an ``OSError``: the command line prints it as one line, exit 2.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from workbench.errors import DiskFullError

NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
"""The errors of a write that found no room: a full disk, a quota, a file too large, a read-only filesystem."""


def is_no_room(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in NO_ROOM


def _free(path: Path) -> int | None:
    """Bytes free on the filesystem holding ``path`` (its nearest existing folder), if it can be said."""
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return None


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def no_room(err: OSError, path: str | os.PathLike[str] | None = None, needed: int | None = None, *,
            removed: bool = True) -> DiskFullError:
    """``DiskFullError`` for ``err``, in one line: the path, what the write needed where known, what is free and
    what to do; ``removed``: the writer removed what it had begun (and the line says so)."""
    where = Path(path if path is not None else err.filename or ".")
    reason = os.strerror(err.errno) if err.errno else str(err)
    free = _free(where.absolute())
    room = ([f"it needed {_size(needed)}"] if needed is not None else []) + \
        ([f"{_size(free)} free on its disk"] if free is not None else [])
    what = "make it writable" if err.errno == errno.EROFS else "free some space"
    detail = f" ({'; '.join(room)})" if room else ""
    after = "; nothing was left half-written" if removed else ""
    return DiskFullError(err.errno or errno.ENOSPC, f"{where}: {reason.lower()}{detail}; {what}, or write "
                         f"elsewhere{after}")


def missing_folders(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, innermost first: what a writer that makes ``path`` made,
    and gives back if it fails."""
    path = Path(path)
    return [f for f in (path, *path.parents) if not f.exists()]


@contextlib.contextmanager
def made(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """``folder``, made with its missing parents; if the block fails, the folders made here are removed again
    (with what the block wrote in them: all of it is this block's). A full disk becomes ``DiskFullError``."""
    folder = Path(folder)
    missing = missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        yield folder
    except BaseException as err:
        if missing:
            shutil.rmtree(missing[-1], ignore_errors=True)  # the outermost folder this block made
        if is_no_room(err) and not isinstance(err, DiskFullError):
            assert isinstance(err, OSError)
            raise no_room(err, getattr(err, "filename", None) or folder) from None
        raise


@contextlib.contextmanager
def written(path: str | os.PathLike[str], *, needed: int | None = None) -> Iterator[Path]:
    """A temporary name beside ``path`` to write, renamed to ``path`` when the block ends: a reader sees the old
    file or the whole new one. If the block fails, the temporary file and any folder made for it are removed,
    and a full disk is ``DiskFullError`` naming ``path`` and ``needed`` bytes."""
    path = Path(path)
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    with made(path.parent):
        try:
            yield partial
            os.replace(partial, path)
        except BaseException as err:
            partial.unlink(missing_ok=True)
            if is_no_room(err) and not isinstance(err, DiskFullError):
                assert isinstance(err, OSError)
                raise no_room(err, path, needed) from None
            raise


CACHES = {"TORCH_EXTENSIONS_DIR": ("~/.cache/torch_extensions", "XDG_CACHE_HOME", "torch_extensions"),
          "TRITON_CACHE_DIR": ("~/.triton/cache", "TRITON_HOME", ".triton/cache")}
"""The caches the recorder's kernels are built into: the variable that moves each, its default folder, and the
variable its default hangs from with the folder below it."""


def _unwritable(folder: Path) -> OSError | None:
    """Why ``folder`` (made if missing) cannot take a file; None when it can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            return None
    except OSError as err:
        return err


def writable_caches(say: Callable[[str], None] | None = None) -> dict[str, str]:
    """Point each of ``CACHES`` that its user left unset, and whose default folder cannot be written (a read-only
    or full home), at a folder under the temporary folder, in ``os.environ`` (processes started later inherit
    it); returns what was set. ``say`` gets one line for each. ``DiskFullError`` in one line when no folder can
    be written, the temporary one included (``TMPDIR`` full or missing)."""
    moved: dict[str, str] = {}
    for variable, (default, parent_variable, below) in CACHES.items():
        if os.environ.get(variable):
            continue
        parent = os.environ.get(parent_variable)
        folder = Path(parent) / below if parent else Path(default).expanduser()
        if _unwritable(folder) is None:
            continue
        try:
            fallback = Path(tempfile.gettempdir()) / f"workbench-{os.getuid()}" / variable.lower()
        except FileNotFoundError:  # no usable temporary folder at all
            raise DiskFullError(errno.ENOENT, f"{folder} cannot be written, and neither can any temporary folder "
                                f"(TMPDIR={os.environ.get('TMPDIR', '')!r}); set {variable} to a folder that "
                                "can") from None
        problem = _unwritable(fallback)
        if problem is not None:
            raise DiskFullError(problem.errno or errno.EROFS, f"{folder} cannot be written, and neither can "
                                f"{fallback} ({(problem.strerror or str(problem)).lower()}); set {variable} to a "
                                "folder that can, or free some space") from None
        os.environ[variable] = moved[variable] = str(fallback)
        if say is not None:
            say(f"{folder} cannot be written; building kernels in {fallback} instead (set {variable} to choose)")
    return moved

"""One writer per run folder: whoever writes a run (``workbench run``, ``--resume``, ``sweep`` and ``demo``,
``replay`` and ``bisect``, ``upgrade``, every ``import-*`` verb, ``record(...)`` in a user's job, Megatron-LM's
``pretrain()`` under the launcher) holds the folder's lock for as long as it writes; a second writer is refused
in one line, naming the holder, before it writes anything. A sweep (and the demo) also holds its study folder, so
a second sweep of that folder is refused before it launches anything.

The lock is the operating system's (``flock`` on ``RUN/writer.lock``), so it is released when its process dies,
however it dies: a killed writer never blocks the next. The file stays, holding the last holder's description.
As that lock is the process's, the threads of one process are kept apart here: another thread of the holder is
refused as another process is.

On a filesystem without working ``flock`` the lock is refused with the reason rather than silently not held. NFS
v4 and NFS v3 with ``lockd`` give ``flock`` across clients (Linux emulates it with ``fcntl`` locks there). Lustre
mounted with ``flock`` does too; mounted with ``localflock`` a lock is seen only on its own node, so two writers
on two nodes are not kept apart there; mounted with neither, ``flock`` fails and the writer is refused.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import inspect
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from workbench.disk import is_no_room, missing_folders, no_room
from workbench.errors import ArgumentError, DiskFullError
from workbench.store import layout

F = TypeVar("F", bound=Callable[..., Any])

LOCK_FILE = "writer.lock"
"""In the run folder, beside ``run.zarr``."""


class RunFolderBusy(ArgumentError):
    """Another process writes this run folder."""


def _inside_a_store(run_dir: Path) -> Path | None:
    """The run store that ``run_dir`` would lie inside (itself or an ancestor a store), if any."""
    for folder in (run_dir, *run_dir.parents):
        if folder.name == layout.STORE_DIR or (folder / "zarr.json").is_file():
            return folder
    return None


class _Hold:
    """One run folder held by this process: by which thread, for which writer, how many times over (a replay
    holds its folder and launches the run, which takes it again in the same thread)."""

    def __init__(self, writer: str) -> None:
        self.thread = threading.get_ident()
        self.thread_name = threading.current_thread().name
        self.writer = writer
        self.count = 1


_HELD: dict[Path, _Hold] = {}
"""The run folders this process holds. The operating system's lock is the process's, so threads are kept apart
here: the holding thread may take its folder again, another thread of the process is refused as another process
would be."""
_HELD_LOCK = threading.Lock()


class WriterLock:
    """The held lock of one run folder; ``release`` (or the process's end) lets the next writer in."""

    def __init__(self, run_dir: Path, handle: int | None) -> None:
        self.run_dir = run_dir
        self._handle = handle
        """None for a hold nested in another of this process."""
        self._held = True

    def release(self, *, remove_folder: bool = False) -> None:
        """Let the next writer in; with ``remove_folder``, first remove the folder if it holds nothing but the
        lock (a writer that made the folder and failed before writing gives it back)."""
        if not self._held:
            return
        with _HELD_LOCK:
            hold = _HELD[self.run_dir]
            if remove_folder and self._handle is not None and hold.count == 1 and \
                    [p.name for p in self.run_dir.iterdir()] == [LOCK_FILE]:
                (self.run_dir / LOCK_FILE).unlink()  # while held: a writer waiting on it takes the next file
                self.run_dir.rmdir()
            self._held = False
            hold.count -= 1
            if hold.count == 0:
                del _HELD[self.run_dir]
            if self._handle is not None:
                fcntl.flock(self._handle, fcntl.LOCK_UN)
                os.close(self._handle)
                self._handle = None


def acquire(run_dir: str | os.PathLike[str], *, writer: str, rank: int | None = None) -> WriterLock:
    """Take the writer's lock of run folder ``run_dir`` (made if absent) for ``writer`` (``workbench run``,
    ``record()``...), held by this process, which is global rank ``rank`` of a multi-rank job if given.
    ``RunFolderBusy`` names the holder when another process has it; ``ArgumentError`` if ``run_dir`` lies inside
    a run store, or its filesystem cannot lock. Another thread of this process that holds the folder is refused
    like another process."""
    folder = Path(run_dir).absolute()
    with _HELD_LOCK:
        hold = _HELD.get(folder)
        if hold is not None and hold.thread == threading.get_ident():  # the same writer, one step further in
            hold.count += 1
            return WriterLock(folder, None)
        if hold is not None:
            raise RunFolderBusy(f"{folder} is being written by {hold.writer} (this process, thread "
                                f"{hold.thread_name!r}): one writer per run folder; wait for it to end, or write "
                                "another folder")
        _HELD[folder] = _Hold(writer)  # claimed for this thread while it takes the operating system's lock
    try:
        return WriterLock(folder, _take(folder, writer, rank))
    except BaseException:
        with _HELD_LOCK:
            del _HELD[folder]
        raise


def _take(folder: Path, writer: str, rank: int | None) -> int:
    """The operating system's lock of ``folder`` for this process (see ``acquire``): the open lock file."""
    store = _inside_a_store(folder)
    if store is not None:
        raise ArgumentError(f"{folder} lies inside the run store {store}: a run folder cannot go there; choose "
                            "a folder outside every run.zarr")
    missing = missing_folders(folder)
    new_file = not (folder / LOCK_FILE).exists()
    while True:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            _give_back(missing)
            if is_no_room(err):
                raise no_room(err, folder / LOCK_FILE) from None
            raise ArgumentError(f"{folder}: cannot create its writer's lock ({err.strerror or err})") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _holder(handle)
            os.close(handle)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise RunFolderBusy(f"{folder} is being written by {holder}: one writer per run folder; wait for "
                                    "it to end, or write another folder") from None
            raise ArgumentError(f"{folder}: its filesystem cannot lock {LOCK_FILE} ({err.strerror or err}), so a "
                                "second writer could not be kept out; write the run on a local disk, or mount "
                                "with flock") from None
        if _still_the_lock_file(folder, handle):
            break
        os.close(handle)  # its holder removed it as we took it (an empty folder given back): take the new one
    try:
        os.ftruncate(handle, 0)
        os.write(handle, json.dumps({"writer": writer, "pid": os.getpid(), "host": socket.gethostname(),
                                     "rank": rank, "since": time.time()}).encode())
    except OSError as err:  # a full disk: no empty lock, and no folder holding only one, is left behind
        if new_file:
            (folder / LOCK_FILE).unlink(missing_ok=True)
        os.close(handle)
        _give_back(missing)
        if is_no_room(err):
            raise no_room(err, folder / LOCK_FILE) from None
        raise
    return handle


def _give_back(missing: list[Path]) -> None:
    """Remove the folders in ``missing`` (innermost first) that the lock made and left empty."""
    for made in missing:
        try:
            made.rmdir()
        except OSError:
            return


def _still_the_lock_file(folder: Path, handle: int) -> bool:
    """Whether ``handle`` is still the file at ``folder/LOCK_FILE`` (a writer that gives back a folder it made
    removes the file while it holds it)."""
    try:
        return os.stat(folder / LOCK_FILE).st_ino == os.fstat(handle).st_ino
    except FileNotFoundError:
        return False


def _holder(handle: int) -> str:
    """The holder's description, as it wrote it (or 'another process' if it has not yet)."""
    try:
        info = json.loads(os.pread(handle, 4096, 0) or b"{}")
        where = f"pid {int(info['pid'])} on {str(info['host'])!r}"
        rank = f", global rank {int(info['rank'])}" if info.get("rank") is not None else ""
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["since"])))
        return f"{str(info['writer'])} ({where}{rank}, since {since})"
    except (ValueError, KeyError, TypeError, OSError):
        return "another process"


@contextmanager
def writing(run_dir: str | os.PathLike[str], *, writer: str, rank: int | None = None,
            discard: bool = False) -> Iterator[WriterLock]:
    """``acquire``, released at the end of the block; a folder the lock made is removed again if the block fails
    before writing anything into it, or, with ``discard`` (an importer: half a store is no store), whatever the
    block wrote in it. A full disk met in a ``discard`` block is ``DiskFullError``."""
    missing = missing_folders(run_dir)
    made = bool(missing)
    lock = acquire(run_dir, writer=writer, rank=rank)
    failed = True
    try:
        yield lock
        failed = False
    except OSError as err:
        if discard and is_no_room(err) and not isinstance(err, DiskFullError):
            raise no_room(err, getattr(err, "filename", None) or run_dir, removed=made) from None
        raise
    finally:
        if made and failed and discard:
            for entry in Path(run_dir).iterdir():
                if entry.name != LOCK_FILE:
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        lock.release(remove_folder=made and failed)
        if made and failed:
            _give_back(missing[1:])  # the folders above it that the lock made, if nothing else went there


def holding(writer: str, folder: str) -> Callable[[F], F]:
    """Decorate a function that writes the run folder passed as its argument ``folder``: it runs holding that
    folder's lock as ``writer`` (an importer, ``upgrade``)."""

    def decorate(function: F) -> F:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def holds(*args: Any, **kwargs: Any) -> Any:
            run_dir = Path(signature.bind(*args, **kwargs).arguments[folder])
            if run_dir.name == layout.STORE_DIR:  # a store named for its folder
                run_dir = run_dir.parent
            with writing(run_dir, writer=writer, discard=True):
                return function(*args, **kwargs)

        return holds  # type: ignore[return-value]

    return decorate

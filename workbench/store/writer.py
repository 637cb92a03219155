"""Writing a run store: create it with its manifest, append per-step rows, set the status,
create and fill the per-site arrays and snapshots.

Imports zarr and numpy only. Rows are buffered and written every ``flush_every`` steps;
the ``done`` flags are written after the data they vouch for. ``BackgroundWriter`` runs
writes off the training thread.
"""

from __future__ import annotations

import math
import os
import queue
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from workbench.statistics import STAT_NAMES, fold_fingerprints
from workbench.store import layout
from workbench.store.manifest import now


def create_store(run_dir: Path, manifest: Mapping[str, Any], steps: int, *,
                 schema_version: int = layout.SCHEMA_VERSION) -> zarr.Group:
    """Create (overwriting) the store of a run with ``steps`` preallocated rows (``schema_version``: an older
    layout, for benchmarks and tests that compare the layouts).

    The store is built beside its place and moved there whole, so a reader sees either no
    store or a complete one, never a half-made group.
    """
    paths = layout.RunPaths(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    staging = staging_folder(run_dir, paths.store)
    try:
        _build_store(staging, manifest, steps, schema_version)
    except BaseException:  # a full disk, an interrupt: no staging folder is left behind
        shutil.rmtree(staging, ignore_errors=True)
        raise
    move_into_place(staging, paths.store)
    return zarr.open_group(paths.store, mode="r+")


def _build_store(staging: Path, manifest: Mapping[str, Any], steps: int, schema_version: int) -> None:
    root = zarr.open_group(staging, mode="w", zarr_format=3)
    root.attrs.update({"kind": layout.STORE_KIND, "schema_version": schema_version, "steps_planned": steps,
                       layout.EVERY_CHUNK_WRITTEN: True, **manifest})
    scalars = root.create_group(layout.SCALARS_GROUP)
    dims = [layout.STEP_DIM]
    chunks = (min(layout.STEP_CHUNK, steps),)
    step = _array(scalars, layout.STEP_DIM, shape=(steps,), chunks=chunks, dtype="int64",
                                dimension_names=dims)
    for start in range(0, steps, chunks[0] * 1024):  # a chunk's worth of memory at a time, not the whole column
        stop = min(steps, start + chunks[0] * 1024)
        step[start:stop] = np.arange(start, stop, dtype=np.int64)
    for name, dtype in layout.SCALAR_FIELDS.items():
        fill = np.nan if dtype.startswith("float") else 0
        _array(scalars, name, shape=(steps,), chunks=chunks, dtype=dtype, fill_value=fill,
                             dimension_names=dims)
    _array(scalars, layout.DONE_FIELD, shape=(steps,), chunks=chunks, dtype="int8", fill_value=0,
                         dimension_names=dims)


def _array(group: zarr.Group, name: str, **spec: Any) -> zarr.Array:
    """Create array ``name`` in ``group`` with the store's codecs (checksummed chunks), opened to write every
    chunk (``layout.EVERY_CHUNK_WRITTEN``)."""
    with zarr.config.set(layout.WRITE_EVERY_CHUNK):
        return group.create_array(name, compressors=layout.COMPRESSORS, **spec)


def _writable(group: zarr.Group, name: str) -> zarr.Array:
    """An existing array of ``group``, opened to write every chunk, fill-valued or not."""
    with zarr.config.set(layout.WRITE_EVERY_CHUNK):
        return layout.array(group, name)


def staging_folder(run_dir: Path, final: Path) -> Path:
    """A fresh folder in ``run_dir`` for building ``final`` (same filesystem, so the move is one rename;
    outside the store, so no reader lists it as a member). What killed writers left of ``final`` is reclaimed
    first (``reclaim_leftovers``)."""
    reclaim_leftovers(run_dir, final)
    staging = run_dir / f".{final.name}.creating-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    return staging


def reclaim_leftovers(run_dir: Path, final: Path) -> list[Path]:
    """The staging and set-aside copies of ``final`` (``.NAME.creating-PID``, ``.NAME.replaced-PID``) whose
    process is gone, reclaimed: a set-aside copy whose ``final`` is missing (the writer was killed between the
    two renames of ``move_into_place``) is moved back, every other one is deleted. The caller holds the run
    folder's writer lock, so no living writer owns them; a folder of a process still alive is left alone.
    Returns the folders reclaimed."""
    reclaimed = []
    for pattern in (f".{final.name}.replaced-*", f".{final.name}.creating-*"):
        for path in sorted(run_dir.glob(pattern)):
            pid = path.name.rsplit("-", 1)[1]
            if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
                continue
            if pattern.startswith(f".{final.name}.replaced") and not final.exists():
                os.rename(path, final)  # the original, set aside by a writer killed before its copy moved in
            else:
                shutil.rmtree(path, ignore_errors=True)
            reclaimed.append(path)
    return reclaimed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or a number no process has: left alone
    return True


def move_into_place(staging: Path, final: Path) -> None:
    """Rename ``staging`` to ``final``; an existing ``final`` is moved aside first and then deleted."""
    old = None
    if final.exists():
        old = staging.parent / f".{final.name}.replaced-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
    os.rename(staging, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


_MANIFEST_LOCK = threading.Lock()


def update_manifest(run_dir: Path, **fields: Any) -> None:
    """Merge ``fields`` into the manifest (zarr rewrites ``zarr.json`` atomically). Threads of one
    process take turns, so that a heartbeat never undoes a status written at the same moment."""
    with _MANIFEST_LOCK:
        root = zarr.open_group(layout.RunPaths(run_dir).store, mode="r+")
        root.attrs.update(fields)


def set_status(run_dir: Path, status: str, **fields: Any) -> None:
    extra = {"ended_at": now()} if status != layout.Status.RUNNING else {}
    update_manifest(run_dir, status=status, **extra, **fields)


class ScalarWriter:
    """Buffers per-step scalars and writes them in contiguous slices on a background thread.

    Global rank 0 only.
    """

    def __init__(self, run_dir: Path, flush_every: int) -> None:
        root = zarr.open_group(layout.RunPaths(run_dir).store, mode="r+")
        scalars = layout.subgroup(root, layout.SCALARS_GROUP)
        self._arrays = {name: _writable(scalars, name) for name in (*layout.SCALAR_FIELDS, layout.DONE_FIELD)
                        if name in scalars or name not in layout.ADDED_SCALARS}  # an older store lacks those
        self._flush_every = flush_every
        self._rows: dict[int, Mapping[str, float]] = {}
        self._background = BackgroundWriter()

    def append(self, step: int, row: Mapping[str, float]) -> None:
        missing = set(layout.SCALAR_FIELDS) - set(row) - set(layout.ADDED_SCALARS)
        if missing:
            raise KeyError(f"step {step} is missing scalars {sorted(missing)}")
        self._rows[step] = {**{name: math.nan for name in layout.ADDED_SCALARS}, **row}
        if len(self._rows) >= self._flush_every:
            self.flush()

    def flush(self, wait: bool = False) -> None:
        """Hand the buffered rows to the writer thread; with ``wait``, until they are on disk."""
        if self._rows:
            rows, self._rows = self._rows, {}
            self._background.submit(lambda: self._write(rows))
        if wait:
            self._background.close()
            self._background = BackgroundWriter()

    def _write(self, rows: dict[int, Mapping[str, float]]) -> None:
        for start, stop in contiguous_ranges(sorted(rows)):
            block = [rows[s] for s in range(start, stop)]
            for name in layout.SCALAR_FIELDS:
                if name in self._arrays:
                    self._arrays[name][start:stop] = np.array([r[name] for r in block])
            self._arrays[layout.DONE_FIELD][start:stop] = 1

    def close(self) -> None:
        self.flush()
        self._background.close()


def contiguous_ranges(steps: list[int]) -> list[tuple[int, int]]:
    """Half-open ranges covering sorted ``steps``: [1, 2, 3, 7] -> [(1, 4), (7, 8)]."""
    ranges: list[tuple[int, int]] = []
    for step in steps:
        if ranges and ranges[-1][1] == step:
            ranges[-1] = (ranges[-1][0], step + 1)
        else:
            ranges.append((step, step + 1))
    return ranges


class BackgroundWriter:
    """Runs store writes on one background thread, in order, with a bounded queue.

    ``submit`` blocks only when ``max_pending`` writes are already waiting (bounded memory).
    A write that fails is re-raised by the next ``submit`` or by ``close``: no error is lost.
    """

    def __init__(self, max_pending: int = 4) -> None:
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="store-writer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if self._error is None:
                try:
                    job()
                except BaseException as err:  # handed to the training thread
                    self._error = err

    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, OSError):  # a full disk stays an OSError, for the callers that say it in one line
                raise OSError(error.errno, f"writing the run store failed: {error.strerror or error}",
                              error.filename) from error
            raise RuntimeError(f"writing the run store failed: {error}") from error

    def submit(self, job: Callable[[], None]) -> None:
        self._raise_pending()
        self._queue.put(job)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._raise_pending()


@dataclass(frozen=True)
class SiteInfo:
    """One recorded site: its id and metadata, as stored along the ``site`` dimension."""

    site: str
    kind: str
    name: str
    layer: int
    order: int
    shape: str
    dtype: str
    numel: int


def create_sites_group(run_dir: Path, steps: list[int], sites: list[SiteInfo]) -> None:
    """Create (replacing) the ``sites`` group for the recorded ``steps`` and ``sites`` (in execution
    order), in the layout of the store's schema version; like the store, it is built aside and appears whole."""
    final = layout.RunPaths(run_dir).store / layout.SITES_GROUP
    version = zarr.open_group(final.parent, mode="r").attrs.get("schema_version", layout.SCHEMA_VERSION)
    staging = staging_folder(Path(run_dir), final)
    build_sites_group(staging, steps, sites, version if isinstance(version, int) else layout.SCHEMA_VERSION)
    move_into_place(staging, final)


def build_sites_group(folder: Path, steps: list[int], sites: list[SiteInfo], schema_version: int) -> None:
    """Write an empty ``sites`` group at ``folder`` (coordinates and site metadata filled, rows to come) in
    the layout of ``schema_version`` (``layout.site_chunking``)."""
    group = zarr.open_group(folder, mode="w", zarr_format=3)
    n_steps, n_sites, n_stats = len(steps), len(sites), len(STAT_NAMES)
    step_chunk = max(1, min(layout.SITE_STEP_CHUNK, n_steps))

    def coordinate(name: str, values: np.ndarray, dtype: str, dim: str) -> None:
        array = _array(group, name, shape=values.shape, dtype=dtype, dimension_names=[dim],
                                   chunks=values.shape or (1,))
        array[:] = values

    coordinate(layout.STEP_DIM, np.asarray(steps, dtype=np.int64), "int64", layout.STEP_DIM)
    coordinate(layout.SITE_DIM, np.array([s.site for s in sites], dtype=object), "str", layout.SITE_DIM)
    coordinate(layout.STAT_DIM, np.array(STAT_NAMES, dtype=object), "str", layout.STAT_DIM)
    for field, dtype in layout.SITE_META_FIELDS.items():
        values = np.array([getattr(s, field) for s in sites], dtype=object if dtype == "str" else dtype)
        coordinate(field, values, dtype, layout.SITE_DIM)
    _array(group, layout.STATS_ARRAY, shape=(n_steps, n_sites, n_stats), dtype="float64", fill_value=np.nan,
           **layout.site_chunking(schema_version, n_steps, n_sites, n_stats),
           dimension_names=[layout.STEP_DIM, layout.SITE_DIM, layout.STAT_DIM])
    _array(group, layout.FINGERPRINT_ARRAY, shape=(n_steps, n_sites), dtype="uint64", fill_value=0,
                       chunks=(step_chunk, n_sites), dimension_names=[layout.STEP_DIM, layout.SITE_DIM])
    done_chunk = step_chunk if schema_version < layout.SHARDED_SINCE else max(1, min(layout.DONE_CHUNK, n_steps))
    _array(group, layout.DONE_FIELD, shape=(n_steps,), dtype="int8", fill_value=0, chunks=(done_chunk,),
                       dimension_names=[layout.STEP_DIM])
    if schema_version >= layout.SHARDED_SINCE:
        bins = -(-n_steps // step_chunk)
        _array(group, layout.BIN_FINGERPRINT_ARRAY, shape=(bins, n_sites), dtype="uint64", fill_value=0,
               chunks=(1, max(n_sites, 1)), dimension_names=[layout.BIN_DIM, layout.SITE_DIM])
        _array(group, layout.BIN_ROWS_ARRAY, shape=(bins,), dtype="int32", fill_value=0,
               chunks=(max(1, min(layout.DONE_CHUNK, bins)),), dimension_names=[layout.BIN_DIM])


class SiteWriter:
    """Writes recorded-step rows into a run's ``sites`` group, the arrays opened once.

    Where ``stats`` is sharded (schema 3), a shard is always written whole: the rows of the shard being
    filled stay in memory (read back from the store only where it already holds some: a resumed run) and
    each write encodes that shard from them, never reading and decoding it again, as a partial write of a
    shard would on every flush. The block's fingerprints stay in memory too, and once every row of a block
    is written, each write into it folds them into ``bin_fingerprint`` (a row written again, as a resumed
    run does, replaces the earlier one in the fold): a flush adds no write of its own but at the end of a
    block.
    """

    def __init__(self, group: Path | zarr.Group) -> None:
        if not isinstance(group, zarr.Group):
            group = layout.subgroup(zarr.open_group(layout.RunPaths(group).store, mode="r+"), layout.SITES_GROUP)
        self._stats = _writable(group, layout.STATS_ARRAY)
        self._fingerprints = _writable(group, layout.FINGERPRINT_ARRAY)
        self._done = _writable(group, layout.DONE_FIELD)
        self._written = layout.read(self._done).astype(bool)  # rows on disk: only those are ever read back
        self._sharded = self._stats.shards is not None
        self._rows = layout.file_chunks(self._stats)[0]
        self._shard: tuple[int, np.ndarray] | None = None  # (first row, rows) of the shard being filled
        self._folds = layout.BIN_FINGERPRINT_ARRAY in group
        if self._folds:
            self._bin_fingerprints = _writable(group, layout.BIN_FINGERPRINT_ARRAY)
            self._bin_rows = _writable(group, layout.BIN_ROWS_ARRAY)
        self._block: tuple[int, np.ndarray] | None = None  # (first row, fingerprints) of the block being filled

    def write(self, first_row: int, stats: np.ndarray, fingerprints: np.ndarray) -> None:
        """Rows ``first_row ..`` (stats [k, site, stat], fingerprints [k, site] uint64), then their done flags."""
        rows = slice(first_row, first_row + stats.shape[0])
        if self._sharded:
            self._write_shards(first_row, stats)
        else:
            self._stats[rows] = stats
        self._fingerprints[rows] = fingerprints
        if self._folds:
            self._write_folds(first_row, fingerprints)
        self._done[rows] = 1
        self._written[rows] = True

    def _blocks(self, first_row: int, count: int) -> list[tuple[int, int, int, int]]:
        """(start, end) of each block rows [first_row, first_row + count) touch, and the part of them written."""
        stop, total = first_row + count, self._stats.shape[0]
        return [(start, min(start + self._rows, total), max(start, first_row), min(start + self._rows, total, stop))
                for start in range(first_row - first_row % self._rows, stop, self._rows)]

    def _held(self, array: zarr.Array, start: int, end: int, fill: float | int) -> np.ndarray:
        """Rows [start, end) of ``array`` as the store holds them, read only where some are written."""
        if self._written[start:end].any():
            return layout.read(array, slice(start, end))
        return np.full((end - start, *array.shape[1:]), fill, dtype=array.dtype)

    def _write_folds(self, first_row: int, fingerprints: np.ndarray) -> None:
        for start, end, lo, hi in self._blocks(first_row, fingerprints.shape[0]):
            if self._block is None or self._block[0] != start:
                self._block = (start, self._held(self._fingerprints, start, end, 0))
            block = self._block[1]
            block[lo - start:hi - start] = fingerprints[lo - first_row:hi - first_row]
            written = self._written[start:end].copy()
            written[lo - start:hi - start] = True
            if written.all():
                self._bin_fingerprints[start // self._rows] = fold_fingerprints(block, np.arange(start, end))
                self._bin_rows[start // self._rows] = end - start

    def _write_shards(self, first_row: int, stats: np.ndarray) -> None:
        for start, end, lo, hi in self._blocks(first_row, stats.shape[0]):
            if lo == start and hi == end:  # the whole shard
                self._stats[start:end] = stats[lo - first_row:hi - first_row]
                if self._shard is not None and self._shard[0] == start:
                    self._shard = None  # its rows in memory are older than what was just written
                continue
            if self._shard is None or self._shard[0] != start:
                self._shard = (start, self._held(self._stats, start, end, np.nan))
            shard = self._shard[1]
            shard[lo - start:hi - start] = stats[lo - first_row:hi - first_row]
            self._stats[start:end] = shard


def write_site_rows(run_dir: Path, first_row: int, stats: np.ndarray, fingerprints: np.ndarray) -> None:
    """Write recorded-step rows ``first_row ..`` once (``SiteWriter`` for a writer that flushes repeatedly)."""
    SiteWriter(run_dir).write(first_row, stats, fingerprints)


def create_snapshot(run_dir: Path, path: str, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: str,
                    source_dtype: str) -> None:
    root = zarr.open_group(layout.RunPaths(run_dir).store, mode="r+")
    array = _array(root, path, shape=shape, chunks=chunks, dtype=dtype, fill_value=np.nan, overwrite=True)
    array.attrs["source_dtype"] = source_dtype


def write_snapshot_region(run_dir: Path, path: str, region: tuple[slice, ...], values: np.ndarray) -> None:
    with zarr.config.set(layout.WRITE_EVERY_CHUNK):
        array = zarr.open_array(layout.RunPaths(run_dir).store / path, mode="r+")
    array[region] = values

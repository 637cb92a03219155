"""Rows of the store's own arrays read straight from their chunk files: what a long run's widgets read first.

    rows = read_rows(node, slice(0, n))                # [row, ...]: numpy, or None where Zarr must read it
    stat = read_rows(stats, slice(0, n), column=3)     # [row, site]: one statistic of a schema 3 ``stats``
    got = read_selection(node, (slice(0, n), slice(None), 3))   # the same, from a Zarr selection

The workbench writes its per-step arrays in one of two shapes (``layout.site_chunking``): chunks of whole rows
(``bytes`` then ``zstd``), or shards of whole rows holding chunks split along the last axis, with a checksummed
index at the end (``sharding_indexed``). For those two, on a local store, this reads each file once and
decodes its chunks in threads (zstd releases the GIL), straight into the result where a chunk is all wanted:
a statistic of 10,000 recorded steps x 1,000 sites in a quarter of the time of zarr-python's read of the same
selection, which runs every chunk through its event loop (``benchmarks/chunk_reads.py``). Any other array,
selection or store (a URL, another codec, a string array) returns None and is read by Zarr. What a read returns
is what Zarr returns, bit for bit (``tests/unit/test_chunk_files.py``); a chunk whose zstd checksum or decoded
size is wrong, a shard index whose crc32c is wrong, or one that points past its file's data (which Zarr 3.1
reads as fill values) is ``DamagedStoreError``; a chunk absent from the folder or from its shard's index reads
as the fill value, as in Zarr (``layout.require_rows`` makes that an error for rows marked done).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import zarr
from numcodecs.zstd import Zstd
from zarr.storage import LocalStore

from workbench.errors import DamagedStoreError

EMPTY = 2**64 - 1
"""A shard index's offset and length for a chunk not written (Zarr's ``MAX_UINT_64``)."""
_BYTES = {"name": "bytes", "configuration": {"endian": "little"}}
_THREADS = min(8, os.cpu_count() or 1)
_THREADED_BYTES = 1 << 20
"""Reads at least this large decode their files in threads; smaller ones cost more to hand out than to do."""
_POOL: list[ThreadPoolExecutor] = []
_POOL_LOCK = threading.Lock()
_ZSTD = Zstd()  # decoding reads the level and checksum flag from each frame


@dataclass(frozen=True)
class _Plan:
    """How ``node``'s files lie: ``rows`` rows per file; in a shard, ``columns`` of the last axis per chunk."""

    folder: Path
    rows: int
    sharded: bool
    columns: int


def read_selection(node: zarr.Array, selection: Any, *, pause: Callable[[], None] | None = None) -> np.ndarray | None:
    """``node[selection]`` for a selection of consecutive rows (``slice``), optionally of every entry of the
    middle axes and one index of the last (``(slice, slice(None), ..., int)``); None for any other. ``pause``:
    see ``read_rows``."""
    if isinstance(selection, slice):
        return read_rows(node, selection, pause=pause)
    if not (isinstance(selection, tuple) and len(selection) == node.ndim and isinstance(selection[0], slice)):
        return None
    *middle, last = selection[1:]
    if any(m != slice(None) for m in middle):
        return None
    if last == slice(None):
        return read_rows(node, selection[0], pause=pause)
    if isinstance(last, int | np.integer) and not isinstance(last, bool) and 0 <= last < node.shape[-1]:
        return read_rows(node, selection[0], column=int(last), pause=pause)
    return None


def read_rows(node: zarr.Array, rows: slice, column: int | None = None, *,
              pause: Callable[[], None] | None = None) -> np.ndarray | None:
    """``node[rows]`` (``node[rows, ..., column]`` with ``column``) read from its files, or None when this
    module does not read ``node`` (see the module docstring); ``DamagedStoreError`` for a damaged file.
    ``pause``: called before each file, and the files decoded in the calling thread alone (not in the shared
    threads, which a pausing read would hold): a background read passes one that blocks while a view is drawn
    (``studies.reading_ahead``), so that the view's reads have the cores and the disk."""
    plan = _plan(node)
    if plan is None or node.ndim == 0 or (column is not None and (node.ndim < 2 or not plan.sharded)):
        return None
    start, stop, stride = rows.indices(node.shape[0])
    if stride != 1:
        return None
    tail = node.shape[1:] if column is None else node.shape[1:-1]
    out = np.empty((max(stop - start, 0), *tail), dtype=node.dtype)
    files = range(start // plan.rows, -(-stop // plan.rows)) if stop > start else range(0)

    def fill(index: int) -> None:
        if pause is not None:
            pause()
        first = index * plan.rows
        low, high = max(start, first), min(stop, first + plan.rows)
        whole = (low, high) == (first, first + plan.rows) and (not plan.sharded or
                                                                (column is not None and plan.columns == 1))
        into = out[low - start:high - start] if whole else None  # a file of rows all wanted: decoded in place
        block = _read_file(node, plan, index, column, into)  # [plan.rows, *tail]
        if block is not into:
            out[low - start:high - start] = block[low - first:high - first]

    if len(files) > 1 and out.nbytes >= _THREADED_BYTES and _THREADS > 1 and pause is None:
        list(_pool().map(fill, files))
    else:
        for index in files:
            fill(index)
    return out


def _pool() -> ThreadPoolExecutor:
    """The threads every read shares (made on first use; a read that waits on them holds no lock they need)."""
    with _POOL_LOCK:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(_THREADS, thread_name_prefix="workbench-chunk-files"))
        return _POOL[0]


def _plan(node: zarr.Array) -> _Plan | None:
    """How to read ``node`` here, or None: not a local Zarr v3 array in one of the two shapes above."""
    store, metadata = node.store_path.store, node.metadata
    if not isinstance(store, LocalStore) or getattr(metadata, "zarr_format", None) != 3 or node.ndim == 0:
        return None
    if node.dtype.kind not in "biuf" or (node.dtype.itemsize > 1 and node.dtype.byteorder == ">"):
        return None
    declared: dict[str, Any] = dict(metadata.to_dict())
    codecs = list(declared.get("codecs") or [])  # lists or tuples, by Zarr's version
    grid = declared.get("chunk_grid", {}).get("configuration", {}).get("chunk_shape")
    if declared.get("storage_transformers") or not isinstance(grid, list | tuple) or \
            tuple(grid[1:]) != tuple(node.shape[1:]):
        return None  # files of whole rows only
    folder = Path(store.root) / node.store_path.path
    if _is_plain(codecs):
        return _Plan(folder, int(grid[0]), sharded=False, columns=0)
    if len(codecs) != 1 or codecs[0].get("name") != "sharding_indexed":
        return None
    config = codecs[0].get("configuration", {})
    inner = config.get("chunk_shape")
    if not (_is_plain(list(config.get("codecs") or [])) and config.get("index_location", "end") == "end"
            and list(config.get("index_codecs") or []) == [_BYTES, {"name": "crc32c"}]
            and isinstance(inner, list | tuple) and tuple(inner[:-1]) == tuple(grid[:-1]) and node.ndim >= 2
            and grid[-1] % inner[-1] == 0):
        return None
    return _Plan(folder, int(grid[0]), sharded=True, columns=int(inner[-1]))


def _is_plain(codecs: list[dict[str, Any]]) -> bool:
    """``bytes`` (little-endian, or no endianness for one-byte types) then ``zstd``."""
    return (len(codecs) == 2 and codecs[0].get("name") == "bytes"
            and codecs[0].get("configuration", {}).get("endian", "little") == "little"
            and codecs[1].get("name") == "zstd")


def _read_file(node: zarr.Array, plan: _Plan, index: int, column: int | None,
               into: np.ndarray | None) -> np.ndarray:
    """The rows of file ``index`` (all of its ``plan.rows``; fill values where nothing was written); ``into``
    itself when its one chunk could be decoded into it."""
    coords = (index, *([0] * (node.ndim - 1)))
    path = plan.folder / node.metadata.encode_chunk_key(coords)
    shape = (plan.rows, *node.shape[1:])
    try:
        handle = open(path, "rb")  # noqa: SIM115 - one descriptor for the index and the chunks: a rewrite
    except FileNotFoundError:  # renames a new file in, and this reads the old one whole
        return _filled(node, shape if column is None else shape[:-1])
    with handle:
        if not plan.sharded:
            return _decode(handle.read(), shape, node, plan, path, into)
        return _read_shard(handle, node, plan, shape, column, path, into)


def _read_shard(handle: Any, node: zarr.Array, plan: _Plan, shape: tuple[int, ...], column: int | None,
                path: Path, into: np.ndarray | None) -> np.ndarray:
    chunks = shape[-1] // plan.columns
    size = os.fstat(handle.fileno()).st_size
    index_bytes = 16 * chunks + 4
    if size < index_bytes:
        raise _damaged(path, plan.folder, f"{size} bytes, less than the shard index's {index_bytes}")
    handle.seek(size - index_bytes)
    raw = handle.read(index_bytes)
    if google_crc32c.value(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
        raise _damaged(path, plan.folder, "the shard index's crc32c checksum does not match")
    index = np.frombuffer(raw[:-4], dtype="<u8").reshape(chunks, 2)
    wanted = range(chunks) if column is None else [column // plan.columns]
    inner = (*shape[:-1], plan.columns)
    parts = []
    for k in wanted:
        offset, length = (int(x) for x in index[k])
        if offset == EMPTY and length == EMPTY:
            parts.append(_filled(node, inner))
            continue
        if offset + length > size - index_bytes:
            raise _damaged(path, plan.folder, f"chunk {k} lies at bytes {offset}+{length}, past the shard's data")
        handle.seek(offset)
        parts.append(_decode(handle.read(length), inner, node, plan, path, into))
    if parts[0] is into:
        return into
    if column is not None:
        return parts[0][..., column % plan.columns]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)


def _decode(raw: bytes, shape: tuple[int, ...], node: zarr.Array, plan: _Plan, path: Path,
            into: np.ndarray | None = None) -> np.ndarray:
    """The chunk ``raw`` as an array of ``shape``: decoded into ``into`` (returned) when its frame declares
    the chunk's size, else into memory of its own."""
    expected = int(np.prod(shape)) * node.dtype.itemsize
    try:
        if into is not None and _content_size(raw) == expected == into.nbytes:
            _ZSTD.decode(raw, out=into)  # the frame's checksum checked as it is decoded
            return into
        decoded = _ZSTD.decode(raw)
    except Exception as err:  # numcodecs raises RuntimeError for a bad frame or checksum
        raise _damaged(path, plan.folder, f"{type(err).__name__}: {err}") from None
    if len(decoded) != expected:
        raise _damaged(path, plan.folder, f"decodes to {len(decoded)} bytes, not the chunk's {expected}")
    return np.frombuffer(decoded, dtype=node.dtype.newbyteorder("<")).reshape(shape)


def _content_size(frame: bytes) -> int | None:
    """The decoded size a zstd frame's header declares (RFC 8878, 3.1.1.1), or None where it declares none."""
    if len(frame) < 6 or frame[:4] != b"\x28\xb5\x2f\xfd":
        return None
    descriptor = frame[4]
    single_segment = (descriptor >> 5) & 1
    at = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]  # window, then dictionary id
    width = (single_segment, 2, 4, 8)[descriptor >> 6]
    if width == 0 or len(frame) < at + width:
        return None
    size = int.from_bytes(frame[at:at + width], "little")
    return size + 256 if width == 2 else size


def _filled(node: zarr.Array, shape: tuple[int, ...]) -> np.ndarray:
    return np.full(shape, node.fill_value, dtype=node.dtype)


def _damaged(path: Path, folder: Path, why: str) -> DamagedStoreError:
    """The array named as ``layout.read`` names it, then the file."""
    return DamagedStoreError(f"{folder}: a chunk cannot be read (file {path.relative_to(folder)}: {why}); the run "
                             "store is damaged (a truncated or corrupt file): rewrite the run")

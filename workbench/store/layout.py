"""The run store's layout: the one module that spells paths, names, dtypes and chunks.

A run lives in a folder:

    <run_dir>/
      run.zarr/                 Zarr v3 group; attributes = the manifest
        scalars/                group, dimension ``step``
          step                  int64 [step]    coordinate 0..steps-1
          loss, grad_norm, lr, loss_scale, step_time, tokens_per_s, recorder_time, val_loss   float64 [step]
          skipped               int8 [step]     1 where fp16 overflow skipped the update
          done                  int8 [step]     1 once the step's row is written (written last)
        sites/                  group, dimensions ``step`` (recorded steps), ``site``, ``stat``
          step                  int64 [step]    the recorded step numbers
          site                  str [site]      "kind:name", in execution order
          stat                  str [stat]      statistic names (workbench.statistics.STAT_NAMES)
          kind, name, shape, dtype   str [site];  layer, order int32 [site];  numel int64 [site]
          stats                 float64 [step, site, stat]   (schema 3: one statistic per chunk, see below)
          fingerprint           uint64 [step, site]
          done                  int8 [step]
          bin_fingerprint       uint64 [bin, site]  (schema 3) each 64 recorded steps' fingerprints folded
          bin_rows              int32 [bin]         (schema 3) the rows each fold holds (0: not folded yet)
        snapshots/step_<K>/<kind>/<name>   full, unsharded tensors (float32 for 16-bit types)
      logs/rank<R>.log          one log per rank
      checkpoints/step_<K>/     state before step K (after K updates)

Schema 3 stores each statistic of 64 recorded steps in a chunk of its own (below 512 sites, a few statistics
per chunk: ``site_chunking``), the chunks of those steps in one shard file (Zarr v3 sharding): a figure of
one statistic reads a twelfth of the bytes, and a flush still writes one file. Schemas 1 and 2 keep every
statistic of 64 steps in one chunk; they read the same (``workbench upgrade`` rewrites them as schema 3).

Arrays are preallocated to the planned number of steps (NaN / 0), so a reader sees the
same shapes while the run writes and after it was killed; ``done`` says which rows are
real. The ``sites`` group is created at the end of the first recorded step, once every
rank's sites are known. Zarr's local store writes each chunk to a temporary file and renames it, so a
chunk is either the old one or the new one, never half-written. Only global rank 0
writes ``scalars`` and ``sites`` (statistics are reduced over ranks first); each rank
writes its own regions of a snapshot, whose chunks are exactly those regions.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import ZstdCodec
from zarr.core.sync import sync
from zarr.storage import LocalStore

from workbench.errors import ArgumentError, DamagedStoreError
from workbench.names import check_name, inside
from workbench.store import chunk_files
from workbench.untrusted import COUNT, JsonField, read_json_object

SCHEMA_VERSION = 3
"""3: statistics apart, a recorded step block's chunks in one shard (``site_chunking``). 2: the manifest
stands on its own (``workbench.store.manifest``: producer, model signature, layout, precision, determinism)
and chunks carry checksums. Version 1 stores (the runner's config holds the facts) and version 2 stores are
read the same way."""
SHARDED_SINCE = 3
"""The first schema whose ``stats`` keeps statistics apart, in chunks inside shards of ``SITE_STEP_CHUNK`` steps."""
STORE_KIND = "workbench.run"

STORE_DIR = "run.zarr"
LOGS_DIR = "logs"
CHECKPOINTS_DIR = "checkpoints"
OP_TRACES_DIR = "op_traces"

SCALARS_GROUP = "scalars"
STEP_DIM = "step"
STEP_CHUNK = 512

SCALARS_LOGGED = "scalars_logged"
"""Manifest field: false where the producer logged no per-step scalars (an import of tensors alone), whose
scalars are NaN at every step; absent (true) otherwise."""

SCALAR_FIELDS: dict[str, str] = {
    "loss": "float64",
    "grad_norm": "float64",
    "lr": "float64",
    "loss_scale": "float64",
    "step_time": "float64",
    "tokens_per_s": "float64",
    "recorder_time": "float64",  # seconds of step_time the recorder spent; tokens_per_s leaves them out
    "val_loss": "float64",  # held-out validation loss after the step's update; NaN where none was computed
    "skipped": "int8",
}
"""Per-step scalars and their dtypes; seconds for ``step_time``."""
TIMING_SCALARS = ("step_time", "tokens_per_s", "recorder_time")
"""The scalars that measure the machine, not the numbers: no noise floor or seed spread is drawn around them."""
ADDED_SCALARS = ("val_loss",)
"""Scalars that stores written before them lack: read as NaN, left out when such a store is written to."""
DONE_FIELD = "done"


def heartbeat_grace(every_s: float) -> float:
    """Seconds without a heartbeat after which a reader on another host takes the writer for dead."""
    return max(3.0 * every_s, 60.0)

SITES_GROUP = "sites"
SITE_DIM = "site"
STAT_DIM = "stat"
SITE_STEP_CHUNK = 64
DONE_CHUNK = 4096
"""Rows of the ``sites`` group's ``done`` flags per chunk from schema 3 (64 before: 157 reads for 10,000 steps)."""
SITE_META_FIELDS: dict[str, str] = {
    "kind": "str", "name": "str", "layer": "int32", "order": "int32", "shape": "str", "dtype": "str", "numel": "int64",
}
STATS_ARRAY = "stats"


MIN_STATISTICS_CHUNK_BYTES = 2**18
"""Schema 3 puts as few statistics in a chunk as keep it this large (uncompressed): one statistic per chunk from
512 sites on; below that, a chunk of one statistic would cost more in per-chunk work than it saves in reads."""


def site_chunking(schema_version: int, steps: int, sites: int, stats: int) -> dict[str, tuple[int, ...]]:
    """``chunks`` (and, from ``SHARDED_SINCE``, ``shards``) of the ``stats`` array of a store of ``schema_version``:
    ``SITE_STEP_CHUNK`` recorded steps of every site per file. Before schema 3 that file is one chunk of all the
    statistics; since, a shard of chunks that each hold the fewest statistics (a divisor of their number) that
    make ``MIN_STATISTICS_CHUNK_BYTES``."""
    rows = max(1, min(SITE_STEP_CHUNK, steps))
    whole = (rows, max(sites, 1), max(stats, 1))
    if schema_version < SHARDED_SINCE:
        return {"chunks": whole}
    per_chunk = next(k for k in range(1, whole[2] + 1)
                     if whole[2] % k == 0 and (rows * whole[1] * k * 8 >= MIN_STATISTICS_CHUNK_BYTES or k == whole[2]))
    return {"chunks": (rows, whole[1], per_chunk), "shards": whole}


def file_chunks(node: zarr.Array) -> tuple[int, ...]:
    """The shape of the regions of ``node`` that are one file each: its shards where it is sharded, else its
    chunks."""
    return tuple(node.shards or node.chunks)


def statistics_per_chunk(node: zarr.Array) -> int:
    """How many statistics one read of a ``stats`` chunk decodes: all of them before schema 3 (and in stores of
    fewer than 512 sites, half or more of them, ``site_chunking``)."""
    return int(node.chunks[-1])
FINGERPRINT_ARRAY = "fingerprint"
BIN_FINGERPRINT_ARRAY = "bin_fingerprint"
"""Schema 3: per block of ``SITE_STEP_CHUNK`` recorded steps and site, ``statistics.fold_fingerprints`` of its
rows, written once all of them are (and again whenever one is rewritten): two runs whose folds agree over a
block are bitwise equal there (but for a 64-bit coincidence), so the first divergence is found by reading the
folds and one block's rows."""
BIN_ROWS_ARRAY = "bin_rows"
"""Schema 3: per block, the number of rows folded into ``bin_fingerprint``: the block's size once all are written,
0 before (a block whose rows are all done and whose count is not its size, in an ended run, is damage)."""
BIN_DIM = "bin"
SNAPSHOTS_GROUP = "snapshots"
COMPRESSORS = (ZstdCodec(level=0, checksum=True),)
"""Every chunk is compressed with a checksum, so a corrupt chunk fails to read instead of reading wrong."""
EVERY_CHUNK_WRITTEN = "every_chunk_written"
"""Manifest flag of stores whose writers put every chunk of a written row on disk, even one that equals
the fill value (Zarr leaves those out by default): in such a store any missing chunk of a done row is
damage. In older stores only the arrays that never hold a chunk of fill values are checked
(``ALWAYS_WRITTEN``)."""
WRITE_EVERY_CHUNK = {"array.write_empty_chunks": True}
"""The Zarr configuration a writer opens arrays under (``zarr.config.set``)."""
MAX_STEPS = 10**8
"""Most planned steps a store may declare when its manifest does not say (a 100 MB ``done`` row)."""
MAX_SITES = 10**6
"""Most sites a store may declare."""
MAX_STATS = 1024
"""Most statistics per site a store may declare."""
MAX_INNER_CHUNKS = MAX_STATS
"""Most chunks a shard file may declare: the store's own shards hold one chunk per statistic at most
(``site_chunking``); a reader walks each chunk's index entry."""


def snapshot_path(step: int, kind: str, name: str) -> str:
    """Path of one snapshot array inside the run group."""
    check_name(name, "snapshot site name", error=ArgumentError)  # one folder of the store: never a path
    return f"{SNAPSHOTS_GROUP}/step_{step:06d}/{kind}/{name}"


def snapshot_arrays(store: Path) -> list[tuple[int, str, str]]:
    """(step, kind, name) of every snapshot array written under a run's store, sorted."""
    found = []
    for meta in sorted((store / SNAPSHOTS_GROUP).glob("step_*/*/*/zarr.json")):
        name_dir = meta.parent
        kind_dir = name_dir.parent
        found.append((int(kind_dir.parent.name.removeprefix("step_")), kind_dir.name, name_dir.name))
    return found


class Status(StrEnum):
    """A run's ``status`` in its manifest."""

    CREATED = "created"
    RUNNING = "running"
    COMPLETE = "complete"
    STOPPED = "stopped"
    FAILED = "failed"
    DIVERGED = "diverged"
    """Stopped where it left its live reference (``workbench run --against``): every step before the stop is
    written; the manifest's ``diverged`` names the step, the site and the reference."""
    INTERRUPTED = "interrupted"
    """A reader's verdict on a 'running' store whose writer is gone; written only by a recorded
    loop stopped with Ctrl-C."""


MEGATRON_CHECKPOINT = "megatron"
"""The subfolder of a checkpoint holding the model in Megatron's distributed-checkpoint format."""
CHECKPOINT_META = "meta.json"
"""A checkpoint's last file: its step, layout and config hash (a checkpoint without it is incomplete)."""
_CHECKPOINT_META_FIELDS = {"step": COUNT, "layout": JsonField(dict, required=False),
                           "config_hash": JsonField(str, required=False)}


def checkpoint_meta(directory: Path) -> dict[str, Any]:
    """A checkpoint's ``meta.json``, its fields checked: ``CheckpointError`` naming the file and the field
    (read by the launcher, which imports no torch, and by the ranks)."""
    return read_json_object(Path(directory) / CHECKPOINT_META, _CHECKPOINT_META_FIELDS)


@dataclass(frozen=True)
class RunPaths:
    """Where each part of one run lives."""

    run_dir: Path

    @property
    def store(self) -> Path:
        return self.run_dir / STORE_DIR

    @property
    def logs(self) -> Path:
        return self.run_dir / LOGS_DIR

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / CHECKPOINTS_DIR

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:06d}"

    @property
    def op_traces(self) -> Path:
        return self.run_dir / OP_TRACES_DIR

    def op_trace(self, step: int, rank: int) -> Path:
        """One rank's operation trace of one step: JSON lines, one operation per line."""
        return self.op_traces / f"step_{step:06d}" / f"rank{rank}.jsonl"

    def op_trace_ranks(self, step: int) -> list[Path]:
        return sorted((self.op_traces / f"step_{step:06d}").glob("rank*.jsonl"))

    def checkpoint_steps(self) -> list[int]:
        """Steps with a complete checkpoint (its ``meta.json`` is written last)."""
        if not self.checkpoints.is_dir():
            return []
        steps = [int(p.name.removeprefix("step_")) for p in self.checkpoints.glob("step_*")
                 if (p / CHECKPOINT_META).is_file()]
        return sorted(steps)


RUN_FOLDER_ENTRIES = (STORE_DIR, LOGS_DIR, CHECKPOINTS_DIR, OP_TRACES_DIR, "replays", "bisect")
"""What the workbench writes in a run folder (besides the writer's lock): all that ``--overwrite`` removes."""


def clear_run_folder(run_dir: Path) -> list[str]:
    """Remove the workbench's own entries (``RUN_FOLDER_ENTRIES``) from the run folder ``run_dir``, to write it
    again; returns the names of the other entries, which stay. ``ArgumentError`` if the folder holds entries
    but no run store (``--overwrite`` replaces a run, never a folder of other files). A link is removed, never
    followed."""
    entries = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
    others = [n for n in entries if n not in RUN_FOLDER_ENTRIES and n != "writer.lock"]
    if resolve_run_dir(run_dir) is None and others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise ArgumentError(f"{run_dir} holds {shown} but no run store ({STORE_DIR}); --overwrite replaces a run, "
                            "never a folder of other files: choose another folder")
    for name in entries:
        entry = run_dir / name
        if name not in RUN_FOLDER_ENTRIES:
            continue
        if entry.is_symlink() or not entry.is_dir():
            entry.unlink()
        else:
            shutil.rmtree(inside(run_dir, entry, "run folder entry"))
    return others


_PARTIAL = re.compile(r"\.[0-9a-f]{32}\.partial$")
"""The temporary name Zarr's ``LocalStore`` writes a file under before renaming it (``_atomic_write``): left
behind when the writer is stopped by a signal mid-write (it removes it on an ``Exception`` only)."""


def remove_partial_files(store: Path) -> list[Path]:
    """Remove the temporary files a stopped writer left in the run store ``store``; returns them. Only while this
    process holds the run folder's lock (no other writer can be mid-write)."""
    found = [Path(folder) / name for folder, _, files in os.walk(store) for name in files if _PARTIAL.search(name)]
    for path in found:
        path.unlink(missing_ok=True)
    return found


def resolve_run_dir(path: Path) -> Path | None:
    """The run folder for a path naming either the folder or its ``run.zarr``; None if neither."""
    if (path / STORE_DIR / "zarr.json").is_file():
        return path
    if path.name == STORE_DIR and (path / "zarr.json").is_file():
        return path.parent
    return None


def array(group: zarr.Group, path: str) -> zarr.Array:
    """The array at ``path`` inside ``group``; ``DamagedStoreError`` if it is missing, a group, or declares
    chunks larger than itself (a chunk is allocated whole when it is read)."""
    node = _node(group, path)
    if not isinstance(node, zarr.Array):
        raise DamagedStoreError(f"{_where(group, path)} is a group where the run store keeps an array; "
                                "the store is damaged (rewrite the run)")
    chunks = node.metadata.chunks if hasattr(node.metadata, "chunks") else node.chunks
    if any(c > max(n, 1) for c, n in zip(chunks, node.shape)):
        raise DamagedStoreError(f"{_where(group, path)} declares chunks {tuple(chunks)} larger than its shape "
                                f"{node.shape}; the store is damaged (rewrite the run)")
    shards = getattr(node, "shards", None)
    if shards is not None:  # the sharding codec's own chunk shape: a reader's work per shard file
        inner = tuple(node.chunks)
        per_shard = math.prod(-(-s // max(c, 1)) for s, c in zip(shards, inner))
        if per_shard > MAX_INNER_CHUNKS:
            raise DamagedStoreError(f"{_where(group, path)} declares inner chunks {inner} in shards {tuple(shards)}: "
                                    f"{per_shard} chunks per shard file, at most {MAX_INNER_CHUNKS}; the store is "
                                    "damaged (rewrite the run)")
    return node


def check_shape(node: zarr.Array, expected: tuple[int, ...], what: str) -> None:
    """``DamagedStoreError`` naming the array unless its shape is ``expected`` (checked before a read
    allocates anything: a declared shape is only a number in ``zarr.json``)."""
    if tuple(node.shape) != tuple(expected):
        where = located(node)
        raise DamagedStoreError(f"{where}: declares shape {tuple(node.shape)} where {what} gives {tuple(expected)}; "
                                "the store is damaged (rewrite the run)")


def require_rows(node: zarr.Array, start: int, stop: int) -> None:
    """``DamagedStoreError`` naming the array and the steps when a chunk holding rows [start, stop) is not
    on disk: Zarr would read it as fill values, and a row marked done is never made of those."""
    if stop <= start:
        return
    chunks = file_chunks(node)
    grid = [range(start // chunks[0], -(-stop // chunks[0]))] + [range(-(-n // c)) for n, c in
                                                                  zip(node.shape[1:], chunks[1:])]
    for coords in itertools.product(*grid):
        if not _chunk_on_disk(node, coords):
            first = coords[0] * chunks[0]
            where = located(node)
            raise DamagedStoreError(f"{where}: the chunk of rows {max(first, start)}-{min(first + chunks[0], stop) - 1}"
                                    " is missing, though those rows are marked done; the run store is damaged (a "
                                    "deleted file): rewrite the run or restore the chunk")


def require_written(node: zarr.Array, start: int = 0, stop: int | None = None, *, what: str) -> None:
    """``DamagedStoreError`` naming the array when a chunk holding rows [start, stop) (all of them by default)
    is not on disk, where the writer wrote those rows (``what``: when it did, for the message). For arrays a
    store writes whole (its coordinates), and for done flags a finished run has written: Zarr would read a
    missing chunk as fill values, and silently."""
    stop = node.shape[0] if stop is None else stop
    chunks = file_chunks(node)
    for index in range(start // chunks[0], -(-stop // chunks[0])):
        coords = (index,) + (0,) * (len(chunks) - 1)
        if not _chunk_on_disk(node, coords):
            first = index * chunks[0]
            raise DamagedStoreError(f"{located(node)}: the chunk of rows {first}-{min(first + chunks[0], stop) - 1}"
                                    f" is missing, though {what}; the run store is damaged (a deleted file): rewrite "
                                    "the run or restore the chunk")


def require_done_chunks(node: zarr.Array) -> None:
    """``DamagedStoreError`` where the done flags ``node`` of a finished run lack a chunk: none written at all,
    or one missing between written ones (a run writes its done flags in step order; one that starts later, a
    replay, leaves out only those before its first step). A missing chunk reads as "not done", silently."""
    size = file_chunks(node)[0]
    written = _written_chunks(node)
    gaps = sorted(set(range(written[0], written[-1] + 1)) - set(written)) if written else [0]
    if node.shape[0] and gaps:
        first = gaps[0] * size
        raise DamagedStoreError(f"{located(node)}: the chunk of rows {first}-{min(first + size, node.shape[0]) - 1} "
                                "is missing, though the run has finished and wrote its done flags in step order; the "
                                "run store is damaged (a deleted file): rewrite the run or restore the chunk")


def located(node: zarr.Array | zarr.Group) -> str:
    """Where ``node`` lives, for messages: a local path, or the URL of a store read through fsspec."""
    store, path = node.store_path.store, node.store_path.path
    if isinstance(store, LocalStore):
        return str(Path(store.root) / path)
    fs, root = getattr(store, "fs", None), str(getattr(store, "path", ""))
    protocol = getattr(fs, "protocol", "")
    scheme = protocol[0] if isinstance(protocol, tuple | list) and protocol else protocol
    return f"{scheme}://{root.lstrip('/')}/{path}".rstrip("/") if scheme else f"{root}/{path}"


def _written_chunks(node: zarr.Array) -> list[int]:
    """The indices of the chunk files of the one-dimensional ``node`` that are on disk, sorted: listed, so the
    work is that of the files there, not of the rows the array declares."""
    key = node.metadata.encode_chunk_key((0,))  # "c/0" (the default), "c.0", "0"
    folder, _, stem = key[:-1].rpartition("/")  # "c", "" | "", "c." | "", ""
    store, path = node.store_path.store, node.store_path.path
    where = "/".join(part for part in (path, folder) if part)
    if isinstance(store, LocalStore):
        try:
            names = os.listdir(Path(store.root) / where)
        except (FileNotFoundError, NotADirectoryError):
            names = []
    else:
        prefix = f"{where}/" if where else ""

        async def listed() -> list[str]:
            return [found[len(prefix):] async for found in store.list_prefix(prefix)]

        names = [name for name in sync(listed()) if "/" not in name]
    return sorted(int(name[len(stem):]) for name in names
                  if name.startswith(stem) and name[len(stem):].isdigit())


def _chunk_on_disk(node: zarr.Array, coords: tuple[int, ...]) -> bool:
    key = node.metadata.encode_chunk_key(coords)
    store, path = node.store_path.store, node.store_path.path
    if isinstance(store, LocalStore):  # one stat, not an event-loop round trip per chunk
        return (Path(store.root) / path / key).is_file()
    return bool(sync(store.exists(f"{path}/{key}" if path else key)))


def subgroup(group: zarr.Group, path: str) -> zarr.Group:
    """The group at ``path`` inside ``group``; ``DamagedStoreError`` if it is missing or an array."""
    node = _node(group, path)
    if not isinstance(node, zarr.Group):
        raise DamagedStoreError(f"{_where(group, path)} is an array where the run store keeps a group; "
                                "the store is damaged (rewrite the run)")
    return node


def contains(group: zarr.Group, path: str) -> bool:
    """Whether ``group`` holds a node at ``path``. One whose metadata cannot be read is there: the reader that
    opens it (``array``, ``subgroup``) names the damage; zarr's own ``in`` raises whatever its parser raised."""
    try:
        return path in group
    except Exception:  # a zarr.json that is no JSON, or not zarr's: present, and damaged
        return True


def _where(group: zarr.Group, path: str) -> str:
    root = located(group)
    return f"{root.rstrip('/')}/{path}"


def _node(group: zarr.Group, path: str) -> zarr.Array | zarr.Group:
    try:
        return group[path]
    except KeyError:
        raise DamagedStoreError(f"{_where(group, path)} is missing: the run store is still being created "
                                "or is damaged (wait for its producer, or rewrite the run)") from None
    except Exception as err:  # zarr raises several types for unreadable metadata
        raise DamagedStoreError(f"{_where(group, path)} cannot be read ({type(err).__name__}: {err}); "
                                "the run store is damaged (rewrite the run)") from None


def read(node: zarr.Array, selection: Any = slice(None), *, pause: Callable[[], None] | None = None) -> np.ndarray:
    """``node[selection]`` as numpy; ``DamagedStoreError`` naming the array if a chunk cannot be decoded. Rows
    of the store's own arrays are read from their files (``chunk_files``; ``pause`` called before each), the
    rest through Zarr."""
    direct = chunk_files.read_selection(node, selection, pause=pause)
    if direct is not None:
        return direct
    try:
        return np.asarray(node[selection])
    except Exception as err:  # the codecs raise RuntimeError, ValueError, ... for a bad chunk
        where = located(node)
        raise DamagedStoreError(f"{where}: a chunk cannot be read ({type(err).__name__}: {err}); the run store "
                                "is damaged (a truncated or corrupt file): rewrite the run") from None


class GuardedArray:
    """A zarr array for ``dask.array.from_array`` whose reads fail as ``DamagedStoreError`` (see ``read``)."""

    def __init__(self, node: zarr.Array, rows: int | None = None) -> None:
        self._node = node
        self.shape = node.shape if rows is None else (min(rows, node.shape[0]), *node.shape[1:])
        self.dtype, self.ndim = node.dtype, node.ndim

    def __getitem__(self, selection: Any) -> np.ndarray:
        return read(self._node, selection)

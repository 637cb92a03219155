"""Writing a run store: create it with its manifest, append per-step rows, set the status.

Imports zarr and numpy only. Rows are buffered and written every ``flush_every`` steps;
the ``done`` flags are written after the data they vouch for.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import zarr

from workbench.store import layout


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def create_store(run_dir: Path, manifest: Mapping[str, Any], steps: int) -> zarr.Group:
    """Create (overwriting) the store of a run with ``steps`` preallocated rows."""
    paths = layout.RunPaths(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    root = zarr.open_group(paths.store, mode="w", zarr_format=3)
    root.attrs.update({"kind": layout.STORE_KIND, "schema_version": layout.SCHEMA_VERSION, **manifest})
    scalars = root.create_group(layout.SCALARS_GROUP)
    dims = [layout.STEP_DIM]
    chunks = (min(layout.STEP_CHUNK, steps),)
    step = scalars.create_array(layout.STEP_DIM, shape=(steps,), chunks=chunks, dtype="int64",
                                dimension_names=dims)
    step[:] = np.arange(steps, dtype=np.int64)
    for name, dtype in layout.SCALAR_FIELDS.items():
        fill = np.nan if dtype.startswith("float") else 0
        scalars.create_array(name, shape=(steps,), chunks=chunks, dtype=dtype, fill_value=fill,
                             dimension_names=dims)
    scalars.create_array(layout.DONE_FIELD, shape=(steps,), chunks=chunks, dtype="int8", fill_value=0,
                         dimension_names=dims)
    return root


def update_manifest(run_dir: Path, **fields: Any) -> None:
    """Merge ``fields`` into the manifest (zarr rewrites ``zarr.json`` atomically)."""
    root = zarr.open_group(layout.RunPaths(run_dir).store, mode="r+")
    root.attrs.update(fields)


def set_status(run_dir: Path, status: str, **fields: Any) -> None:
    extra = {"ended_at": now()} if status != layout.Status.RUNNING else {}
    update_manifest(run_dir, status=status, **extra, **fields)


class ScalarWriter:
    """Buffers per-step scalars and writes them in contiguous slices (global rank 0 only)."""

    def __init__(self, run_dir: Path, flush_every: int) -> None:
        root = zarr.open_group(layout.RunPaths(run_dir).store, mode="r+")
        self._group = root[layout.SCALARS_GROUP]
        self._arrays = {name: self._group[name] for name in (*layout.SCALAR_FIELDS, layout.DONE_FIELD)}
        self._flush_every = flush_every
        self._rows: dict[int, Mapping[str, float]] = {}

    def append(self, step: int, row: Mapping[str, float]) -> None:
        missing = set(layout.SCALAR_FIELDS) - set(row)
        if missing:
            raise KeyError(f"step {step} is missing scalars {sorted(missing)}")
        self._rows[step] = row
        if len(self._rows) >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        if not self._rows:
            return
        steps = sorted(self._rows)
        for start, stop in _contiguous(steps):
            rows = [self._rows[s] for s in range(start, stop)]
            for name in layout.SCALAR_FIELDS:
                self._arrays[name][start:stop] = np.array([r[name] for r in rows])
            self._arrays[layout.DONE_FIELD][start:stop] = 1
        self._rows.clear()

    def close(self) -> None:
        self.flush()


def _contiguous(steps: list[int]) -> list[tuple[int, int]]:
    """Half-open ranges covering sorted ``steps``: [1, 2, 3, 7] -> [(1, 4), (7, 8)]."""
    ranges: list[tuple[int, int]] = []
    for step in steps:
        if ranges and ranges[-1][1] == step:
            ranges[-1] = (ranges[-1][0], step + 1)
        else:
            ranges.append((step, step + 1))
    return ranges

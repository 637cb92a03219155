"""Upgrading a run store in place to the current schema (``workbench upgrade RUN``).

    plan = upgrade_plan(open_run("data/runs/demo/det-r0"))   # what it rewrites, the space it needs
    upgrade_store("data/runs/demo/det-r0", progress=print)

Schema 3 keeps each statistic in a chunk of its own (``layout.site_chunking``): a store of schema 1 or
2 reads the same, but every statistic it shows costs a read of all of them. The upgrade rewrites the
``sites`` group beside the store's, row block by row block, values copied bit for bit (only the rows
marked done: a killed run's unwritten rows stay unwritten), then moves it into place and records the
new schema in the manifest. A reader sees the old group or the new one (two renames, the old one
deleted after). Stores still being written are refused, and so is a disk without room for the copy.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from workbench.errors import ArgumentError
from workbench.store import layout
from workbench.store.manifest import now
from workbench.store.reader import Run, open_run
from workbench.store.writer import (
    SiteInfo,
    SiteWriter,
    build_sites_group,
    contiguous_ranges,
    move_into_place,
    staging_folder,
    update_manifest,
)
from workbench.store.writer_lock import holding

_BLOCK = 8 * layout.SITE_STEP_CHUNK
"""Recorded steps copied at once (whole shards of the new layout)."""
_MARGIN = 1.05
"""Room asked for beyond the size of the group being rewritten (the compressed sizes differ a little)."""
_BUSY = (layout.Status.CREATED, layout.Status.RUNNING)


@dataclass(frozen=True)
class UpgradePlan:
    run_dir: Path
    schema_version: int
    rewrite_bytes: int
    """At most the bytes of the rewritten ``sites`` group, which lies beside the old one until the swap."""
    free_bytes: int

    @property
    def needed(self) -> bool:
        return self.schema_version < layout.SCHEMA_VERSION

    def summary(self) -> str:
        if not self.needed:
            return f"{self.run_dir}: schema {self.schema_version}, already the current layout; nothing to do"
        return (f"{self.run_dir}: schema {self.schema_version} -> {layout.SCHEMA_VERSION}; rewrites its per-site "
                f"records ({_mb(self.rewrite_bytes)}) beside them, so needs {_mb(self.space_needed)} free "
                f"({_mb(self.free_bytes)} free)")

    @property
    def space_needed(self) -> int:
        return int(self.rewrite_bytes * _MARGIN)


def upgrade_plan(run: Run) -> UpgradePlan:
    """What upgrading ``run`` rewrites and the room it needs; ``ArgumentError`` for a store still being written, or
    one read through fsspec (copy it here, upgrade it, and copy it back)."""
    if run.url is not None:
        raise ArgumentError(f"{run.url}: a store read through fsspec is upgraded where it lies as a folder; copy it "
                            "to a local folder, upgrade that, and copy it back")
    status = run.status
    if status in _BUSY:
        raise ArgumentError(f"{run.path}: the run is {status}: its producer still writes the store; upgrade it "
                            "once the run has ended (or been stopped)")
    version = int(run.attrs.get("schema_version", 1))
    return UpgradePlan(run.path, version, _rewritten_bytes(run) if run.has_sites else 0,
                       shutil.disk_usage(run.path).free)


def _rewritten_bytes(run: Run) -> int:
    """At most what the rewritten ``sites`` group takes: its arrays uncompressed (the new layout may compress
    less than the old: one statistic per chunk), every planned row, and a page per chunk file."""
    table = run.site_table()
    source = layout.subgroup(zarr.open_group(run.paths.store, mode="r"), layout.SITES_GROUP)
    stats = layout.array(source, layout.STATS_ARRAY)
    rows, sites = int(stats.shape[0]), len(table)
    values = rows * sites * (int(stats.shape[2]) * 8 + 8) + rows * 9  # statistics, fingerprints, done and step
    files = -(-rows // layout.SITE_STEP_CHUNK) * (2 + int(stats.shape[2]))
    return values + files * 4096


@holding("workbench upgrade", "path")
def upgrade_store(path: str | Path, *, progress: Callable[[str], None] | None = None) -> UpgradePlan:
    """Upgrade the run store at ``path`` in place (see the module docstring); its plan, as carried out."""
    run = open_run(path)
    plan = upgrade_plan(run)
    if not plan.needed:
        return plan
    if plan.space_needed > plan.free_bytes:
        raise ArgumentError(f"{plan.summary()}: not enough room; free {_mb(plan.space_needed - plan.free_bytes)} "
                            "more on that filesystem")
    if run.has_sites:
        try:
            _rewrite_sites(run, progress or (lambda _: None))
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
            raise ArgumentError(f"{run.path}: the disk filled while the per-site records were rewritten; the store "
                                f"is unchanged (schema {plan.schema_version}) and the copy is removed. "
                                f"{plan.summary()}") from err
    update_manifest(run.path, schema_version=layout.SCHEMA_VERSION,
                    upgraded={"from_schema": plan.schema_version, "at": now()})
    return plan


def _rewrite_sites(run: Run, progress: Callable[[str], None]) -> None:
    source = layout.subgroup(zarr.open_group(run.paths.store, mode="r"), layout.SITES_GROUP)
    table = run.site_table()  # every site array's shape checked against the others first
    infos = [SiteInfo(site=str(site), kind=str(row["kind"]), name=str(row["name"]), layer=int(row["layer"]),
                      order=int(row["order"]), shape=str(row["shape"]), dtype=str(row["dtype"]),
                      numel=int(row["numel"])) for site, row in table.iterrows()]
    steps = layout.read(layout.array(source, layout.STEP_DIM)).tolist()
    final = run.paths.store / layout.SITES_GROUP
    staging = staging_folder(run.path, final)
    try:
        build_sites_group(staging, steps, infos, layout.SCHEMA_VERSION)
        writer = SiteWriter(zarr.open_group(staging, mode="r+"))
        stats, fingerprints = layout.array(source, layout.STATS_ARRAY), layout.array(source, layout.FINGERPRINT_ARRAY)
        done = np.flatnonzero(layout.read(layout.array(source, layout.DONE_FIELD)).astype(bool)).tolist()
        copied = 0
        for first, stop in contiguous_ranges(done):
            for start in range(first, stop, _BLOCK):
                end = min(stop, start + _BLOCK)
                layout.require_rows(stats, start, end)
                layout.require_rows(fingerprints, start, end)
                writer.write(start, layout.read(stats, slice(start, end)), layout.read(fingerprints, slice(start, end)))
                copied += end - start
                progress(f"upgrading {run.path.name}: {copied}/{len(done)} recorded steps")
        move_into_place(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _mb(size: int) -> str:
    return f"{size / 2**20:,.1f} MB"

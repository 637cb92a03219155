"""Reading run stores: ``open_run`` and ``list_runs``, with pandas and xarray views.

Works while a run is being written and after it was killed: only rows flagged ``done``
are returned. Imports no torch.

    run = open_run("data/runs/demo/det-r0")
    run.scalars                     # pandas DataFrame indexed by step
    run.dataset()                   # xarray Dataset with a labelled ``step`` dimension
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr
import zarr

from workbench.config import RunConfig
from workbench.errors import (
    ArgumentError,
    DamagedStoreError,
    ForeignRunError,
    NoSitesError,
    NotARunError,
    NotRecordedYetError,
    RunNotFoundError,
    SchemaVersionError,
    UntrustedFileError,
    WorkbenchError,
)
from workbench.sites import site_id, split_site
from workbench.store import layout
from workbench.store.manifest import Provenance, RunManifest, check_facts, parse_manifest
from workbench.store.op_trace import read_trace
from workbench.store.records import RunRecords


class Run:
    """One run store, opened for reading."""

    def __init__(self, run_dir: Path, url: str | None = None) -> None:
        self.paths = layout.RunPaths(run_dir)
        self.url = url
        """The store's URL where it is read through fsspec (``memory://``, ``s3://`` ...); None for a local folder,
        whose logs, checkpoints and operation traces lie beside it (a store at a URL has none of those here)."""
        self._store: str | Path = url if url is not None else self.paths.store
        self._root = zarr.open_group(self._store, mode="r")
        self._scalars = layout.subgroup(self._root, layout.SCALARS_GROUP)
        self._sites: zarr.Group | None = None
        self._done_checked = False

    def __repr__(self) -> str:
        return f"Run({self.name!r}, {self.status}, {self.steps_completed}/{self.steps_planned} steps)"

    @property
    def path(self) -> Path:
        return self.paths.run_dir

    @cached_property
    def attrs(self) -> dict[str, Any]:
        """The store's attributes as written (JSON): every field, including those the typed manifest does
        not name. Read ``manifest`` instead wherever a field is named."""
        return dict(self._root.attrs)

    @cached_property
    def manifest(self) -> RunManifest:
        """The typed manifest: model signature, layout, precision, determinism, producer."""
        return parse_manifest(self.attrs, source=str(self.paths.store))

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def run_id(self) -> str:
        return self.manifest.run_id

    @cached_property
    def config(self) -> RunConfig:
        """The workbench runner's config of this run; ``ForeignRunError`` for any other producer's run."""
        if self.manifest.config is None:
            raise ForeignRunError(f"{self.path}: made by {self.manifest.producer!r}, not by the workbench runner: it "
                                  "has no workbench run config")
        return RunConfig.from_dict(self.manifest.config, source=f"{self.paths.store} (manifest)")

    @cached_property
    def steps_planned(self) -> int:
        """Rows of the scalars: bounded by what the manifest plans, every scalar array of that shape."""
        planned = int(layout.array(self._scalars, layout.DONE_FIELD).shape[0])
        stated = self.attrs.get("steps_planned", (self.manifest.config or {}).get("steps"))
        bound = stated if isinstance(stated, int) and not isinstance(stated, bool) else layout.MAX_STEPS
        if planned > bound:
            raise DamagedStoreError(f"{self.paths.store}: the scalars declare {planned} steps where the manifest "
                                    f"plans {bound}; the store is damaged (rewrite the run)")
        for name in layout.SCALAR_FIELDS:
            if self._holds_scalar(name):
                layout.check_shape(layout.array(self._scalars, name), (planned,), "the scalars' done row")
        return planned

    def _holds_scalar(self, name: str) -> bool:
        """Whether the store keeps scalar ``name``: all but those added since (``layout.ADDED_SCALARS``), which
        only stores written before them lack; a store that writes every chunk is newer than all of them (a
        missing one there is damage, named when it is read)."""
        return name not in layout.ADDED_SCALARS or self.every_chunk_written or layout.contains(self._scalars, name)

    @property
    def every_chunk_written(self) -> bool:
        """Whether every chunk of a done row is on disk (``layout.EVERY_CHUNK_WRITTEN``): then a missing one
        of any array is damage; in older stores only the site records are checked."""
        return self.attrs.get(layout.EVERY_CHUNK_WRITTEN) is True

    @property
    def done(self) -> np.ndarray:
        """Per planned step: whether its row has been written (re-read on every access)."""
        node = layout.array(self._scalars, layout.DONE_FIELD)
        if not self._done_checked:  # once: a finished run's flags no longer change
            if self._finished:
                layout.require_done_chunks(node)
            self._done_checked = True
        # read up to the checked number of steps: a declared shape is not allocated unchecked
        return layout.read(node, slice(0, self.steps_planned)).astype(bool)

    @property
    def _finished(self) -> bool:
        """Whether its writer marked it complete, in a store that writes every chunk (``every_chunk_written``):
        then a chunk missing from what it wrote is damage, not a step still to come."""
        return self.every_chunk_written and self.attrs.get("status") == layout.Status.COMPLETE

    def _completed_span(self) -> tuple[int, int]:
        """[first, end) of the steps written without a gap from the first written one."""
        done = self.done
        if not done.any():
            return 0, 0
        first = int(np.argmax(done))
        rest = done[first:]
        return first, first + (int(np.argmin(rest)) if not rest.all() else len(rest))

    @property
    def first_step(self) -> int:
        """The first step written: 0, except for a replay, which starts at its checkpoint."""
        return self._completed_span()[0]

    @property
    def steps_completed(self) -> int:
        """The end (exclusive) of the steps written without a gap from the first one."""
        return self._completed_span()[1]

    @property
    def status(self) -> str:
        """The stored status; a 'created' or 'running' store whose launcher is gone reads 'interrupted'."""
        attrs = dict(zarr.open_group(self._store, mode="r").attrs)
        check_facts(attrs, str(self._store))  # re-read while it runs: checked each time
        status = str(attrs.get("status", layout.Status.CREATED))
        if status in (layout.Status.CREATED, layout.Status.RUNNING) and \
                not _producer_alive(attrs.get("launcher") or {}, attrs.get("heartbeat")):
            return layout.Status.INTERRUPTED
        return status

    @property
    def scalars(self) -> pd.DataFrame:
        """Per-step scalars of the completed steps, indexed by ``step``."""
        group = self._scalars
        first, end = self._completed_span()
        frame = pd.DataFrame({name: self._rows(layout.array(group, name), first, end, strict=self.every_chunk_written)
                              if self._holds_scalar(name)
                              else np.full(end - first, np.nan) for name in layout.SCALAR_FIELDS},
                             index=pd.Index(np.arange(first, end), name=layout.STEP_DIM))
        frame["skipped"] = frame["skipped"].astype(bool)
        return frame

    def dataset(self) -> xr.Dataset:
        """The scalars as a lazy xarray Dataset (``xarray.open_zarr``), completed steps only."""
        step = layout.array(self._scalars, layout.STEP_DIM)
        if self.every_chunk_written:
            layout.require_written(step, what="the store writes its coordinates whole")
        layout.read(step, slice(0, self.steps_planned))  # the index xarray reads at once: damage named, not raised
        ds = xr.open_zarr(self._store, group=layout.SCALARS_GROUP, consolidated=False)
        first, end = self._completed_span()
        return ds.drop_vars(layout.DONE_FIELD).isel({layout.STEP_DIM: slice(first, end)})

    # -- per-site records ----------------------------------------------------------------

    @property
    def has_sites(self) -> bool:
        return layout.contains(self._root, layout.SITES_GROUP)

    def _sites_group(self) -> zarr.Group:
        """The ``sites`` group, its shapes checked: opened once it exists (its arrays' shapes never change; their
        rows are read afresh each time)."""
        if self._sites is None:
            if not self.has_sites:
                status = self.status
                if status in (layout.Status.CREATED, layout.Status.RUNNING):
                    raise NotRecordedYetError(f"{self.path}: run {self.name!r} is {status} and has not written its "
                                              f"first recorded step yet ({self.steps_completed}/{self.steps_planned} "
                                              "steps); try again once it has (`workbench ls` shows its progress)")
                raise NoSitesError(f"{self.path}: run {self.name!r} has no per-site records (record.enabled = "
                                   "false, or it ended before its first recorded step was written)")
            group = layout.subgroup(zarr.open_group(self._store, mode="r"), layout.SITES_GROUP)
            self._check_site_shapes(group)
            self._sites = group
        return self._sites

    def _check_site_shapes(self, group: zarr.Group) -> None:
        """Every site array's declared shape agrees with the others and lies within the scalars' and the
        store's bounds, before any of them is read (each is allocated whole, or graphed, when read)."""
        steps = layout.array(group, layout.DONE_FIELD).shape[0]
        sites = layout.array(group, layout.SITE_DIM).shape[0]
        stats = layout.array(group, layout.STAT_DIM).shape[0]
        if steps > self.steps_planned or sites > layout.MAX_SITES or stats > layout.MAX_STATS:
            raise DamagedStoreError(f"{self.paths.store}/{layout.SITES_GROUP}: declares {steps} recorded steps "
                                    f"(of {self.steps_planned} planned), {sites} sites (at most {layout.MAX_SITES})"
                                    f" and {stats} statistics; the store is damaged (rewrite the run)")
        what = "the recorded steps, sites and statistics"
        layout.check_shape(layout.array(group, layout.STEP_DIM), (steps,), "the recorded steps' done row")
        for name in layout.SITE_META_FIELDS:
            layout.check_shape(layout.array(group, name), (sites,), "the site coordinate")
        layout.check_shape(layout.array(group, layout.STATS_ARRAY), (steps, sites, stats), what)
        layout.check_shape(layout.array(group, layout.FINGERPRINT_ARRAY), (steps, sites), what)
        if self.every_chunk_written:  # what the store wrote whole when it made the group: read as fill values else
            for name in (layout.STEP_DIM, layout.SITE_DIM, layout.STAT_DIM, *layout.SITE_META_FIELDS):
                layout.require_written(layout.array(group, name), what="the store writes its coordinates whole")
        if self._finished:
            layout.require_done_chunks(layout.array(group, layout.DONE_FIELD))

    @staticmethod
    def _rows(node: zarr.Array, start: int, stop: int, *, strict: bool = True) -> np.ndarray:
        """Rows [start, stop) of ``node``, marked done: a missing chunk among them is damage (``strict``)."""
        if strict:
            layout.require_rows(node, start, stop)
        return layout.read(node, slice(start, stop))

    @property
    def recorded_steps_completed(self) -> int:
        """Recorded steps written without a gap from the first one."""
        done = layout.read(layout.array(self._sites_group(), layout.DONE_FIELD)).astype(bool)
        return int(np.argmin(done)) if not done.all() else len(done)

    def sites(self) -> xr.Dataset:
        """Statistics and fingerprints as a lazy xarray Dataset, labelled: ``stats`` (step, site, stat) and
        ``fingerprint`` (step, site), coordinates ``step`` (the recorded step numbers), ``site`` (names in
        execution order), ``stat`` and the site metadata (kind, name, layer, order, shape, dtype, numel);
        written steps only; ``attrs["run"]`` is the run's name. Two runs' differences:
        ``analysis.labelled_difference(open_run(a).sites(), open_run(b).sites())``."""
        group, n = self._sites_group(), self.recorded_steps_completed
        for name in (layout.STATS_ARRAY, layout.FINGERPRINT_ARRAY):
            layout.require_rows(layout.array(group, name), 0, n)
        ds = xr.open_zarr(self._store, group=layout.SITES_GROUP, consolidated=False)
        internal = [v for v in (layout.DONE_FIELD, layout.BIN_FINGERPRINT_ARRAY, layout.BIN_ROWS_ARRAY) if v in ds]
        ds = ds.set_coords(list(layout.SITE_META_FIELDS)).drop_vars(internal)  # the folds are the store's own
        ds = ds.drop_dims([d for d in ds.dims if d not in (layout.STEP_DIM, layout.SITE_DIM, layout.STAT_DIM)])
        # the site metadata in memory (a value per site): a selection by kind or layer needs no compute
        ds = ds.assign_coords({f: ds[f].compute() for f in layout.SITE_META_FIELDS if f in ds.coords})
        ds.attrs = {"run": self.name}
        return ds.isel({layout.STEP_DIM: slice(0, self.recorded_steps_completed)})

    def site_table(self) -> pd.DataFrame:
        """One row per site, in execution order: kind, name, layer, order, shape, dtype, numel."""
        group = self._sites_group()
        return pd.DataFrame({f: layout.read(layout.array(group, f)) for f in layout.SITE_META_FIELDS},
                            index=pd.Index(self._site_names(group), name=layout.SITE_DIM))

    def site_names(self) -> list[str]:
        """The sites, in execution order (what ``site_table`` is indexed by, read without the rest)."""
        return self._site_names(self._sites_group())

    @property
    def stats_nbytes(self) -> int:
        """Memory every statistic of every written recorded step and site takes once read."""
        source = layout.array(self._sites_group(), layout.STATS_ARRAY)
        return self.recorded_steps_completed * int(np.prod(source.shape[1:])) * source.dtype.itemsize

    @cached_property
    def reads_statistics_apart(self) -> bool:
        """Whether a statistic reads without all the others (schema 3: ``layout.site_chunking``)."""
        source = layout.array(self._sites_group(), layout.STATS_ARRAY)
        return layout.statistics_per_chunk(source) < source.shape[-1]

    @property
    def has_bin_fingerprints(self) -> bool:
        """Whether the store folds each block of recorded steps' fingerprints (schema 3: ``layout.BIN_ROWS_ARRAY``)."""
        return self.has_sites and layout.contains(self._sites_group(), layout.BIN_ROWS_ARRAY)

    def bin_fingerprints(self, rows: int) -> tuple[int, np.ndarray]:
        """(rows per block, the folds [block, site]) of the whole blocks among the first ``rows`` written rows;
        ``DamagedStoreError`` where a block's count of folded rows is not the block's size (in a run still
        being written, the blocks ahead of its last flush are left out instead)."""
        group = self._sites_group()
        folds, counts = layout.array(group, layout.BIN_FINGERPRINT_ARRAY), layout.array(group, layout.BIN_ROWS_ARRAY)
        size = int(layout.file_chunks(layout.array(group, layout.FINGERPRINT_ARRAY))[0])
        steps, sites = layout.array(group, layout.DONE_FIELD).shape[0], layout.array(group, layout.SITE_DIM).shape[0]
        layout.check_shape(folds, (-(-steps // size), sites), "the recorded steps in blocks, and the sites")
        layout.check_shape(counts, (-(-steps // size),), "the recorded steps in blocks")
        whole = rows // size
        written = layout.read(counts, slice(0, whole))
        short = np.flatnonzero(written != size)
        if len(short):
            if self.status == layout.Status.RUNNING:
                whole = int(short[0])
            else:
                raise DamagedStoreError(f"{self.paths.store}/{layout.SITES_GROUP}/{layout.BIN_ROWS_ARRAY}: block "
                                        f"{int(short[0])} folds {int(written[short[0]])} of its {size} written rows; "
                                        "the store is damaged (rewrite the run)")
        layout.require_rows(folds, 0, whole)
        return size, layout.read(folds, slice(0, whole))

    def fingerprint_rows(self, start: int, stop: int) -> np.ndarray:
        """Fingerprints of written rows [start, stop) (uint64 [row, site], sites in execution order)."""
        return self._rows(layout.array(self._sites_group(), layout.FINGERPRINT_ARRAY), start, stop)

    def recorded_step_numbers(self) -> np.ndarray:
        """The step number of each written recorded row."""
        group = self._sites_group()
        return self._recorded_steps(group, self.recorded_steps_completed).to_numpy()

    def fingerprints(self) -> pd.DataFrame:
        """Fingerprints (uint64), one row per written recorded step, one column per site."""
        group = self._sites_group()
        return self._fingerprints(group, self.recorded_steps_completed)

    def _fingerprints(self, group: zarr.Group, n: int) -> pd.DataFrame:
        return pd.DataFrame(self._rows(layout.array(group, layout.FINGERPRINT_ARRAY), 0, n), copy=False,
                            columns=self._site_names(group), index=self._recorded_steps(group, n))

    def stat(self, name: str) -> pd.DataFrame:
        """One statistic (e.g. ``"l2"``), one row per written recorded step, one column per site."""
        values = self.statistic(name)
        return pd.DataFrame(values.to_numpy(), copy=False, index=values.indexes[layout.STEP_DIM],
                            columns=list(values.indexes[layout.SITE_DIM]))

    def statistic(self, name: str, steps: tuple[int, int] | None = None, *,
                  pause: Callable[[], None] | None = None) -> xr.DataArray:
        """One statistic in memory as (step, site), labelled as ``records().stats.sel(stat=name)``; read in one
        pass, a twelfth of the bytes of them all in a schema 3 store. ``steps`` (first, last): the recorded
        rows from the first recorded step at or after ``first`` to the last at or before ``last`` (and the rows
        between them) only. ``pause``: called before each file read (a background read that gives way to a view
        being drawn, ``studies.reading_ahead``)."""
        group, n = self._sites_group(), self.recorded_steps_completed
        names = self._stat_names(group)
        if name not in names:
            raise ArgumentError(f"no statistic {name!r}; the statistics are {', '.join(names)}")
        source = layout.array(group, layout.STATS_ARRAY)
        layout.require_rows(source, 0, n)
        numbers = self._recorded_steps(group, n).to_numpy()
        start, stop = 0, n
        if steps is not None:
            inside = np.flatnonzero((numbers >= steps[0]) & (numbers <= steps[1]))
            start, stop = (int(inside[0]), int(inside[-1]) + 1) if len(inside) else (0, 0)
        return xr.DataArray(layout.read(source, (slice(start, stop), slice(None), names.index(name)), pause=pause),
                            dims=(layout.STEP_DIM, layout.SITE_DIM),
                            coords={layout.STEP_DIM: numbers[start:stop],
                                    layout.SITE_DIM: np.array(self._site_names(group), dtype=object),
                                    layout.STAT_DIM: name})

    @staticmethod
    def _site_names(group: zarr.Group) -> list[str]:
        return [str(s) for s in layout.read(layout.array(group, layout.SITE_DIM))]

    @staticmethod
    def _stat_names(group: zarr.Group) -> list[str]:
        return [str(s) for s in layout.read(layout.array(group, layout.STAT_DIM))]

    @staticmethod
    def _recorded_steps(group: zarr.Group, n: int) -> pd.Index:
        return pd.Index(layout.read(layout.array(group, layout.STEP_DIM), slice(0, n)), name=layout.STEP_DIM)

    def op_trace_steps(self) -> list[int]:
        """Steps with an operation trace (``workbench replay --trace``, ``workbench bisect``)."""
        if not self.paths.op_traces.is_dir():
            return []
        return sorted(int(p.name.removeprefix("step_")) for p in self.paths.op_traces.glob("step_*")
                      if self.paths.op_trace_ranks(int(p.name.removeprefix("step_"))))

    def op_trace(self, step: int) -> pd.DataFrame:
        """Every rank's traced operations of ``step``, one row per operation and rank."""
        files = self.paths.op_trace_ranks(step)
        if not files:
            traced = ", ".join(map(str, self.op_trace_steps())) or "none"
            raise NoSitesError(f"{self.path}: no operation trace of step {step} (traced steps: {traced}); "
                               f"make one with `workbench replay {self.path} --step {step} --trace`")
        trace = read_trace(files)
        if trace.empty:
            raise NoSitesError(f"{self.path}: the operation trace of step {step} holds no operations "
                               f"({', '.join(f.name for f in files)} are empty)")
        return trace

    def records(self, *, lazy: bool = True, scalars: pd.DataFrame | None = None) -> RunRecords:
        """Fingerprints in memory and statistics for ``workbench.analysis``: Dask-backed (read
        chunk by chunk when a result needs them, so stores larger than memory work) unless
        ``lazy=False`` loads them. ``scalars``: the run's ``scalars`` where the caller holds them already."""
        group, n = self._sites_group(), self.recorded_steps_completed
        fingerprints = self._fingerprints(group, n)  # the same rows as the statistics, while a run writes more
        stats = self._lazy_statistics(group, n, fingerprints.index.to_numpy(), fingerprints.columns.to_numpy())
        return RunRecords(name=self.name, fingerprints=fingerprints, stats=stats if lazy else stats.load(),
                          model=self.manifest.model.shape() if self.manifest.model else {}, status=self.status,
                          resumes=self.manifest.resumes, scalars=self.scalars if scalars is None else scalars)

    def statistics(self) -> xr.DataArray:
        """Every statistic (step, site, stat) of the written recorded steps, Dask-backed: ``records().stats``
        without reading the fingerprints."""
        group, n = self._sites_group(), self.recorded_steps_completed
        return self._lazy_statistics(group, n, self._recorded_steps(group, n).to_numpy(),
                                     np.array(self._site_names(group), dtype=object))

    def _lazy_statistics(self, group: zarr.Group, n: int, steps: np.ndarray, sites: np.ndarray) -> xr.DataArray:
        import dask.array as da  # here, not at the top: every rank process imports this module to write its run
        source = layout.array(group, layout.STATS_ARRAY)
        layout.require_rows(source, 0, n)
        # Dask reads chunk by chunk through a guard that names this store when a chunk is damaged; the
        # graph spans the written rows only, never the declared shape.
        data = da.from_array(layout.GuardedArray(source, rows=n), chunks=source.chunks)  # one statistic each in v3
        return xr.DataArray(data, dims=(layout.STEP_DIM, layout.SITE_DIM, layout.STAT_DIM),
                            coords={layout.STEP_DIM: steps, layout.SITE_DIM: sites,
                                    layout.STAT_DIM: self._stat_names(group)})

    def records_or_none(self) -> RunRecords | None:
        """``records()``, or None for a run that recorded no sites (its scalars are all there is)."""
        try:
            return self.records()
        except NoSitesError:
            return None

    def snapshot(self, step: int, site: str) -> np.ndarray:
        """The full tensor of ``site`` ("kind:name") recorded at ``step``."""
        kind, name = split_site(site)
        path = layout.snapshot_path(step, kind, name)
        try:
            array = zarr.open_array(self._at(path), mode="r")
        except (FileNotFoundError, KeyError, ValueError):
            raise NoSitesError(f"{self.path}: no snapshot of {site} at step {step}; "
                           "set record.snapshot_steps and record.snapshot_sites") from None
        if self.every_chunk_written:  # each rank's region is a chunk of its own: every one must be there
            layout.require_rows(array, 0, array.shape[0] if array.ndim else 0)
        return layout.read(array, ...)

    def snapshot_dtype(self, step: int, site: str) -> str:
        """The dtype the tensor had in training (snapshots of 16-bit tensors are stored as float32)."""
        kind, name = split_site(site)
        array = zarr.open_array(self._at(layout.snapshot_path(step, kind, name)), mode="r")
        return str(array.attrs.get("source_dtype", array.dtype))

    def snapshots(self) -> dict[int, list[str]]:
        """Recorded snapshots: step -> sites ("kind:name")."""
        found: dict[int, list[str]] = {}
        listed = layout.snapshot_arrays(self.paths.store) if self.url is None else _snapshot_members(self._root)
        for step, kind, name in listed:
            found.setdefault(step, []).append(site_id(kind, name))
        return found

    def _at(self, path: str) -> str | Path:
        """Where the node at ``path`` inside the store lives."""
        return f"{self.url}/{path}" if self.url is not None else self.paths.store / path

    @property
    def logs_scalars(self) -> bool:
        """Whether its producer logged the per-step scalars (loss, gradient norm, ...): an import of tensors
        alone (TE's debug statistics, Megatron-LM's dumps) holds NaN there, which is no NaN of the training's."""
        return self.attrs.get(layout.SCALARS_LOGGED) is not False

    @property
    def final_loss(self) -> float:
        n = self.steps_completed
        return float(layout.read(layout.array(self._scalars, "loss"), n - 1)) if n else float("nan")


def _snapshot_members(root: zarr.Group) -> list[tuple[int, str, str]]:
    """(step, kind, name) of every snapshot array, listed through Zarr (a store at a URL has no folders to glob)."""
    if not layout.contains(root, layout.SNAPSHOTS_GROUP):
        return []
    found = []
    for step_name, step_group in layout.subgroup(root, layout.SNAPSHOTS_GROUP).groups():
        for kind, kind_group in step_group.groups():
            found += [(int(step_name.removeprefix("step_")), kind, name) for name, _ in kind_group.arrays()]
    return sorted(found)


def _producer_alive(launcher: Any, heartbeat: Any) -> bool:
    """Whether the process writing a run still lives: its pid on its own host; from any other host,
    a heartbeat (``{"at": epoch seconds, "every_s": interval}``) newer than a few intervals."""
    if isinstance(launcher, dict) and launcher.get("host") == socket.gethostname():
        return _pid_alive(launcher.get("pid"))
    if isinstance(heartbeat, dict) and isinstance(heartbeat.get("at"), int | float) \
            and isinstance(heartbeat.get("every_s"), int | float):
        return time.time() - heartbeat["at"] <= layout.heartbeat_grace(heartbeat["every_s"])
    return True  # cannot tell from here; trust the stored status


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def open_recorded(path: str | os.PathLike[str]) -> Run:
    """``open_run`` for a verb that reads recorded steps: ``NotRecordedYetError`` (exit 75, "not yet") while the run
    is being written and has not completed its first step, never an empty answer or a refusal as bad input."""
    run = open_run(path)
    first, end = run._completed_span()
    if end <= first and run.status in (layout.Status.CREATED, layout.Status.RUNNING):
        raise NotRecordedYetError(f"{run.path}: run {run.name!r} is {run.status} and has not written its first "
                                  f"recorded step yet ({end}/{run.steps_planned} steps); try again once it has "
                                  "(`workbench ls` shows its progress)")
    return run


def open_run(path: str | os.PathLike[str]) -> Run:
    """Open the run store at ``path`` (the run folder or its ``run.zarr``), or at a URL that fsspec reads
    (``memory://runs/a``, ``s3://bucket/runs/a``; the filesystem's package installed, its credentials as
    fsspec finds them)."""
    if isinstance(path, str) and "://" in path and not path.startswith("file://"):
        return _open_url(path)
    path = Path(str(path).removeprefix("file://"))
    if not path.exists():
        raise RunNotFoundError(f"{path}: no such run; create one with `workbench run CONFIG.toml`")
    run_dir = layout.resolve_run_dir(path)
    if run_dir is None:
        raise NotARunError(f"{path}: not a run store (no {layout.STORE_DIR}/ with a zarr.json inside); "
                           "pass a run folder made by `workbench run`")
    _check_store(layout.RunPaths(run_dir).store, str(path))
    _closed_world(layout.RunPaths(run_dir).store)
    if not (layout.RunPaths(run_dir).store / layout.SCALARS_GROUP / "zarr.json").is_file():
        raise DamagedStoreError(f"{path}: the run store has no {layout.SCALARS_GROUP}/ group: it is still being "
                                "created by its producer (try again in a moment) or it is damaged")
    run = Run(run_dir)
    _ = run.manifest  # every manifest field checked once, here, before any verb reads one
    return run


def _closed_world(store: Path) -> None:
    """Refuse a store in which a symbolic link leads outside it: every file a reader opens lies inside the
    store (the store itself may be reached through links). One ``os.scandir`` pass over its entries."""
    root = store.resolve()
    pending = [store]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_symlink():
                    target = Path(entry.path).resolve()
                    if not target.is_relative_to(root):
                        raise UntrustedFileError(f"{entry.path}: a link to {target}, outside the run store "
                                                 f"{store}; a store reads only its own files (copy the file in)")
                    continue  # a link inside the store: its target is walked where it lies
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))


def _check_store(store: str | Path, shown: str) -> zarr.Group:
    """The store's root group, once it is a workbench run of a schema this package reads."""
    try:
        root = zarr.open_group(store, mode="r")
        attrs = dict(root.attrs)
    except Exception as err:  # zarr raises several types for a damaged group
        raise NotARunError(f"{shown}: the Zarr group cannot be read ({err})") from None
    if attrs.get("kind") != layout.STORE_KIND:
        raise NotARunError(f"{shown}: a Zarr group, but not a workbench run (attribute kind = "
                           f"{attrs.get('kind')!r}, expected {layout.STORE_KIND!r})")
    version = attrs.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version > layout.SCHEMA_VERSION:
        raise SchemaVersionError(f"{shown}: store schema version {version!r} is newer than this workbench "
                                 f"reads ({layout.SCHEMA_VERSION}); upgrade the workbench package")
    return root


def _open_url(url: str) -> Run:
    """``open_run`` of a store read through fsspec: the same checks, with Zarr's own reads in place of files."""
    url = url.rstrip("/")
    store = url if url.endswith(f"/{layout.STORE_DIR}") else f"{url}/{layout.STORE_DIR}"
    try:
        import fsspec

        fs, root = fsspec.core.url_to_fs(store)
        exists = fs.exists(f"{root}/zarr.json")
    except (ImportError, ValueError) as err:  # no filesystem for the scheme, or a malformed URL
        raise RunNotFoundError(f"{url}: cannot be read ({err})") from None
    if not exists:
        raise RunNotFoundError(f"{url}: no run store there (no {layout.STORE_DIR}/zarr.json)")
    root = _check_store(store, url)
    if not layout.contains(root, layout.SCALARS_GROUP):
        raise DamagedStoreError(f"{url}: the run store has no {layout.SCALARS_GROUP}/ group: it is still being "
                                "created by its producer (try again in a moment) or it is damaged")
    run = Run(Path(store.removesuffix(f"/{layout.STORE_DIR}")), url=store)  # a path no local file lies at
    _ = run.manifest
    return run


def provenance(runs: Sequence[Run]) -> Provenance:
    """Where ``runs`` came from, for the footer of a figure or a table drawn from them."""
    revisions = sorted({str(r.attrs.get("git_revision")) for r in runs if r.attrs.get("git_revision")})
    return Provenance(runs=tuple(r.run_id for r in runs),
                      configs=tuple(dict.fromkeys(r.manifest.summary() for r in runs)),
                      schema_version=int(runs[0].attrs.get("schema_version", layout.SCHEMA_VERSION)
                                         if runs else layout.SCHEMA_VERSION),
                      revision=", ".join(revisions) or None)


Skipped = Callable[[Path, WorkbenchError], None]
"""Told of each folder a folder-wide reader skipped, and why."""


def open_runs(*paths: str | os.PathLike[str], on_skip: Skipped | None = None) -> list[Run]:
    """The runs at ``paths``: each a run folder, or a folder of runs (every run under it, its derived runs, such as
    replays, only when named). ``RunNotFoundError`` for a path that is neither, or when no run is found. A run
    found under a folder that cannot be read is handed to ``on_skip`` with the reason, if given, and left out;
    without ``on_skip`` its error is raised. A run named directly is always read, or refused."""
    runs: list[Run] = []
    for path in map(Path, paths):
        run_dir = layout.resolve_run_dir(path)
        if run_dir is not None:
            runs.append(open_run(run_dir))
        elif path.is_dir():
            found = find_runs(path, unreadable=True)
            if not found:
                raise RunNotFoundError(f"{path}: neither a run nor a folder of runs (no run.zarr under it)")
            for folder in found:
                try:
                    run = open_run(folder)
                except WorkbenchError as err:
                    if on_skip is None:
                        raise
                    on_skip(folder, err)
                    continue
                if run.manifest.replay is None:
                    runs.append(run)
        else:
            raise RunNotFoundError(f"{path}: no such run or folder; the demo's runs are made by `make demo` "
                                   "(or `workbench demo`)")
    if not runs:
        raise RunNotFoundError(f"no runs under {', '.join(map(str, paths))}; the demo's runs are made by "
                               "`make demo` (or `workbench demo`)")
    return runs


def find_runs(directory: str | os.PathLike[str], *, derived: bool = False, unreadable: bool = False) -> list[Path]:
    """Run folders under ``directory`` (any depth), sorted by path. A run's derived runs (its replays,
    ``RUN/replays/step_K``, and bisections, ``RUN/bisect/A-vs-B``) live inside its folder: listed only with
    ``derived`` (``derived_runs`` lists one run's). With ``unreadable``, also the folders whose ``run.zarr`` has
    no ``zarr.json`` (a zarr v2 store, a store half copied), for a listing to say why it skips them."""
    directory = Path(directory)
    if not directory.is_dir():
        raise RunNotFoundError(f"{directory}: no such directory")
    found = []
    for folder, subfolders, _ in os.walk(directory):
        if layout.STORE_DIR in subfolders:  # a run: its store's thousands of chunk folders are not walked
            subfolders.remove(layout.STORE_DIR)
            if unreadable or (Path(folder) / layout.STORE_DIR / "zarr.json").is_file():
                found.append(Path(folder))
                if not derived:
                    subfolders.clear()  # what lies inside a run folder is derived from it
    return sorted(found)


def derived_runs(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The runs derived from the run in ``run_dir`` (replays, bisections), which live inside its folder."""
    return [f for f in find_runs(run_dir, derived=True) if f != Path(run_dir)]


RUN_TABLE_COLUMNS = ["name", "run_id", "config", "steps", "status", "final_loss", "path"]


def run_table(runs: list[Run]) -> pd.DataFrame:
    """One row per run: id, name, config summary, steps, status, final loss, path."""
    rows = [_row(run) for run in runs]
    return pd.DataFrame(rows, columns=RUN_TABLE_COLUMNS)


def _row(run: Run) -> list[Any]:
    return [run.name, run.run_id, run.manifest.summary(), f"{run.steps_completed}/{run.steps_planned}", run.status,
            run.final_loss, str(run.path)]


def list_runs(directory: str | os.PathLike[str],
              on_skip: Skipped | None = None, *, derived: bool = False) -> pd.DataFrame:
    """One row per run under ``directory`` (``run_table``; with ``derived``, the runs derived from them too:
    ``find_runs``). Folders that are not readable runs are skipped, each handed to ``on_skip`` with the
    reason."""
    rows = []
    for run_dir in find_runs(directory, derived=derived, unreadable=on_skip is not None):
        try:
            rows.append(_row(open_run(run_dir)))
        except WorkbenchError as err:
            if on_skip is not None:
                on_skip(run_dir, err)
        except Exception as err:  # whatever else a damaged store raises: one run, never the whole listing
            if on_skip is not None:
                on_skip(run_dir, DamagedStoreError(f"{run_dir}: unreadable ({type(err).__name__}: {err})"))
    return pd.DataFrame(rows, columns=RUN_TABLE_COLUMNS)

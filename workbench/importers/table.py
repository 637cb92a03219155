"""Statistics logged by other tools as one long table, and what the workbench builds from it.

Every importer reads its format into the same *long table*, one row per logged value:

    step   int64     the training iteration
    site   category  workbench site id, "kind:name"
    stat   category  workbench statistic name (``STAT_NAMES``) where one matches, else the
                     tool's own name ("mean", "std", "dynamic_range", ...)
    value  float64

and this module turns that table into what the rest of the workbench reads:

    records = records_from_table(table, "run-a")         # RunRecords, for workbench.analysis
    write_run_from_table(table, run_dir, name="run-a",   # a real run store, for every tool
                         imported={"format": ..., "files": [...]})
    table = long_table(records, stats=("min", "max", "l2"))   # the other way, for writers

Logs hold no tensor fingerprints, so the fingerprint of a (step, site) is a 64-bit hash of
the bits of every statistic logged for it (``statistic_fingerprints``): two runs compare
equal at a site exactly when they logged bitwise the same numbers there. That is weaker
than a tensor fingerprint: a difference too small to change any logged statistic, or lost
to the log's rounding, is not seen. Imports no torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from workbench.errors import ArgumentError, ImportFormatError
from workbench.sites import layer_of, split_site
from workbench.statistics import STAT_NAMES
from workbench.store import layout
from workbench.store.manifest import RunManifest, new_run_id, store_attributes
from workbench.store.records import RunRecords
from workbench.store.writer import (
    ScalarWriter,
    SiteInfo,
    create_sites_group,
    create_store,
    set_status,
    update_manifest,
    write_site_rows,
)

LONG_COLUMNS: tuple[str, ...] = ("step", "site", "stat", "value")
FINGERPRINT_NOTE = "hash of the logged statistics, not of the tensor"
_BLOCK = 512  # steps written to the store at once (a multiple of the store's step chunk)
_ROWS_AT_ONCE = 1 << 20  # long-table rows deduplicated at once
SCALAR_ROWS_AT_ONCE = 1 << 14  # unlogged scalar rows handed to the writer at once (a multiple of its step chunk)
MAX_UNLOGGED_STEPS = 1 << 17
"""The most steps an import adds to a store beyond the records it read. A store has a row for every step from 0 to
the last one logged, and a log may start late (a resumed run), but a damaged step number must not make a billion
empty rows: the last step must be below the number of records read plus this."""


def check_last_step(last: int, records: int, where: str) -> None:
    """``ImportFormatError`` naming ``where`` (the file, line and field) when step ``last`` is beyond what ``records``
    records can reach (``MAX_UNLOGGED_STEPS``)."""
    limit = records + MAX_UNLOGGED_STEPS
    if last >= limit:
        raise ImportFormatError(f"{where}: step {last:,} is beyond the {limit:,} steps that {records:,} records "
                                f"can reach (at most {MAX_UNLOGGED_STEPS:,} steps without records); the step number "
                                "is damaged: correct or remove that record")


@dataclass(frozen=True)
class TableArrays:
    """A long table as dense arrays, duplicates dropped (the first logged value is kept)."""

    steps: np.ndarray
    """int64 [step], sorted."""
    sites: list[str]
    """In order of first appearance at the first step each site was logged at."""
    stats: list[str]
    """Every statistic name in the table, in order of first appearance."""
    values: np.ndarray
    """float64 [step, site, stat]; NaN where nothing was logged."""
    present: np.ndarray
    """bool [step, site, stat]: a value was logged (tells a logged NaN from a missing one)."""
    conflicting_duplicates: int
    """(step, site, stat) logged more than once with different values (e.g. by several ranks)."""


def table_arrays(table: pd.DataFrame) -> TableArrays:
    """Dense arrays of a long table (see the module docstring)."""
    missing = [c for c in LONG_COLUMNS if c not in table.columns]
    if missing:
        raise ImportFormatError(f"a long table needs the columns {', '.join(LONG_COLUMNS)}; "
                                f"missing {', '.join(missing)}")
    if table.empty:
        raise ImportFormatError("the table of logged statistics is empty: nothing to import")
    # Row codes are built in place, one int64 array at a time: a long table may hold tens of millions of rows.
    flat, steps = _codes(table["step"].to_numpy(dtype=np.int64), sort=True)  # [row] step code; int64 [step]
    site_code, site_names = _codes(table["site"])  # [row] in order of appearance
    stat_code, stat_names = _codes(table["stat"])
    if len(site_code) and min(site_code.min(), stat_code.min()) < 0:
        raise ImportFormatError("the table of logged statistics has rows without a site or a statistic")
    shape = (len(steps), len(site_names), len(stat_names))
    _check_dense(shape, len(table), table.attrs.get("files") or ["the table of logged statistics"])
    # Site order: by the first step a site appears at, then by where it first appears.
    first_step = np.full(len(site_names), len(steps), dtype=np.int64)
    np.minimum.at(first_step, site_code, flat)
    order = np.lexsort((np.arange(len(site_names)), first_step))  # [site] new position -> old code
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    flat *= shape[1] * shape[2]  # [row] (step, site, stat) as one index of the dense [step, site, stat]
    flat += (rank * shape[2])[site_code]
    flat += stat_code
    del site_code, stat_code
    value = table["value"].to_numpy(dtype=np.float64)
    values = np.full(shape, np.nan)
    present = np.zeros(shape, dtype=bool)
    cells, logged = values.reshape(-1), present.reshape(-1)  # views
    differing = []  # [cell] logged more than once, with different bits
    # A block of rows at a time, in the table's order, so that a value logged twice (by several ranks) keeps the
    # first file's, and the sorting that finds each cell's first row never holds more than a block.
    for start in range(0, len(flat), _ROWS_AT_ONCE):
        rows = flat[start:start + _ROWS_AT_ONCE]
        row_values = value[start:start + _ROWS_AT_ONCE]
        unique, first = np.unique(rows, return_index=True)
        new = ~logged[unique]
        cells[unique[new]] = row_values[first[new]]
        logged[unique[new]] = True
        if len(unique) < len(rows) or not new.all():
            differs = cells[rows].view(np.uint64) != row_values.view(np.uint64)  # [row]
            differing.append(rows[differs])
    conflicts = len(np.unique(np.concatenate(differing))) if differing else 0
    return TableArrays(steps=steps, sites=[str(site_names[i]) for i in order], stats=[str(s) for s in stat_names],
                       values=values, present=present, conflicting_duplicates=conflicts)


def _codes(column: pd.Series | np.ndarray, *, sort: bool = False) -> tuple[np.ndarray, Any]:
    """Integer [row] codes of ``column`` (-1 where missing; the categories' own small integers for a categorical)
    and its distinct values, numbered in order of first appearance (``sort``: ascending)."""
    if isinstance(column, pd.Series) and isinstance(column.dtype, pd.CategoricalDtype):  # its own small codes
        small = column.cat.codes.to_numpy()  # [row] int8 below 128 categories
        seen = pd.unique(small)
        seen = seen[seen >= 0]
        renumber = np.full(len(column.cat.categories) + 1, -1, dtype=small.dtype)  # [category + missing]
        renumber[seen] = np.arange(len(seen))
        return renumber[small], column.cat.categories[seen]
    codes, uniques = pd.factorize(column, sort=False)
    if sort:  # renumbered in place (``take`` buffers its output): a second [row] array is never kept
        order = np.argsort(uniques)
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        np.take(rank, codes, out=codes)
        uniques = np.asarray(uniques)[order]
    return codes, uniques


MAX_EMPTY_CELLS_PER_VALUE = 64
"""How sparse the dense [step, site, stat] arrays of a long table may be: at most this many cells per logged value
(or ``DENSE_CELLS_FLOOR`` cells in all). Real logs fill most cells; a table of a few values at thousands of distinct
steps, sites and statistics would ask for terabytes."""
DENSE_CELLS_FLOOR = 1 << 24


def _check_dense(shape: tuple[int, int, int], rows: int, files: list[str]) -> None:
    cells = shape[0] * shape[1] * shape[2]
    if cells > max(DENSE_CELLS_FLOOR, MAX_EMPTY_CELLS_PER_VALUE * rows):
        raise ImportFormatError(f"{', '.join(map(str, files))[:300]}: {rows:,} logged values at {shape[0]:,} steps of "
                                f"{shape[1]:,} sites and {shape[2]:,} statistics would fill {cells:,} cells, more than "
                                f"{MAX_EMPTY_CELLS_PER_VALUE} per value; a log names the same sites and statistics at "
                                "each step it logs: these are not such logs, or they are damaged")


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wraps modulo 2^64): every input bit moves every output bit."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _stat_key(name: str) -> np.uint64:
    """A 64-bit key per statistic name, so a value moved to another statistic changes the hash."""
    return np.uint64(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little"))


def statistic_fingerprints(values: np.ndarray, present: np.ndarray, stats: Sequence[str]) -> np.ndarray:
    """uint64 [step, site]: a hash of the bits of every logged statistic (values [step, site, stat]).

    A sum of one mixed word per logged (statistic, value), so it depends on neither the order
    of the statistics in the table nor on statistics that were not logged.
    """
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    keys = np.array([_stat_key(s) for s in stats], dtype=np.uint64)  # [stat]
    words = np.where(present, _mix(bits ^ _mix(keys)), np.uint64(0))  # [step, site, stat]
    return words.sum(axis=-1, dtype=np.uint64)  # the sum wraps modulo 2^64


def records_from_table(table: pd.DataFrame, name: str) -> RunRecords:
    """``RunRecords`` of a long table, fingerprints = ``statistic_fingerprints`` (see the module docstring)."""
    arrays = table_arrays(table)
    return _records(arrays, name)


def _records(arrays: TableArrays, name: str) -> RunRecords:
    step_index = pd.Index(arrays.steps, name=layout.STEP_DIM)
    fingerprints = pd.DataFrame(statistic_fingerprints(arrays.values, arrays.present, arrays.stats),
                                index=step_index, columns=arrays.sites)
    stats = xr.DataArray(_workbench_stats(arrays), dims=(layout.STEP_DIM, layout.SITE_DIM, layout.STAT_DIM),
                         coords={layout.STEP_DIM: arrays.steps, layout.SITE_DIM: arrays.sites,
                                 layout.STAT_DIM: list(STAT_NAMES)})
    return RunRecords(name=name, fingerprints=fingerprints, stats=stats, model={}, status=layout.Status.COMPLETE)


def _workbench_stats(arrays: TableArrays) -> np.ndarray:
    """float64 [step, site, STAT_NAMES]: the table's workbench statistics, NaN where not logged."""
    out = np.full((*arrays.values.shape[:2], len(STAT_NAMES)), np.nan)
    for i, stat in enumerate(STAT_NAMES):
        if stat in arrays.stats:
            out[..., i] = arrays.values[..., arrays.stats.index(stat)]
    return out


def long_table(records: RunRecords, stats: Sequence[str] = STAT_NAMES) -> pd.DataFrame:
    """The long table of ``records`` restricted to ``stats``: rows by step, then site, then stat."""
    unknown = [s for s in stats if s not in STAT_NAMES]
    if unknown:
        raise ArgumentError(f"unknown statistics {unknown}; choose from {', '.join(STAT_NAMES)}")
    values = records.stats.sel({layout.STAT_DIM: list(stats)}).transpose(
        layout.STEP_DIM, layout.SITE_DIM, layout.STAT_DIM).to_numpy()  # [step, site, stat]
    n_steps, n_sites, n_stats = values.shape
    return pd.DataFrame({
        "step": np.repeat(np.asarray(records.steps, dtype=np.int64), n_sites * n_stats),
        "site": pd.Categorical.from_codes(np.tile(np.repeat(np.arange(n_sites), n_stats), n_steps),
                                          categories=records.sites),
        "stat": pd.Categorical.from_codes(np.tile(np.arange(n_stats), n_steps * n_sites), categories=list(stats)),
        "value": values.reshape(-1),
    })


def row_keys(table: pd.DataFrame, key: Callable[[str, str], str]) -> np.ndarray:
    """object [row]: ``key(site, stat)`` for every row of a long table, computed once per distinct pair."""
    sites, stats = table["site"].cat.categories, table["stat"].cat.categories
    keys = np.asarray([key(str(site), str(stat)) for site in sites for stat in stats], dtype=object)
    # int64: categorical codes are int8 below 128 categories, and site x stat would wrap around
    site_code = table["site"].cat.codes.to_numpy().astype(np.int64)
    stat_code = table["stat"].cat.codes.to_numpy().astype(np.int64)
    return keys[site_code * len(stats) + stat_code]


def write_run_from_table(table: pd.DataFrame, run_dir: str | Path, *, name: str | None = None,
                         imported: Mapping[str, Any]) -> Path:
    """Write a run store from a long table; returns its folder.

    The manifest's producer is ``import: <format>``; what a log does not say (the model, the
    layout, the precision, determinism) is absent from it. The store has last logged step + 1
    steps; the per-step scalars (loss, ...) are NaN and every step is marked written, so the run
    reads as complete. ``imported`` goes into the manifest under ``"imported"``, with what the
    fingerprints are and what was dropped.
    """
    run_dir = Path(run_dir)
    arrays = table_arrays(table)
    if arrays.steps[0] < 0:
        raise ImportFormatError(f"logged steps must be >= 0; the first one is {int(arrays.steps[0])}")
    check_last_step(int(arrays.steps[-1]), len(table), "the table of logged statistics")
    steps = int(arrays.steps[-1]) + 1
    run_name = name or run_dir.name
    info = RunManifest(run_id=new_run_id(run_name), name=run_name,
                       producer=f"import: {imported.get('format', 'table')}")
    create_store(run_dir, store_attributes(info, status=layout.Status.CREATED, imported={
        **imported, "fingerprint": FINGERPRINT_NOTE,
        "statistics_not_stored": [s for s in arrays.stats if s not in STAT_NAMES],
        "conflicting_duplicates": arrays.conflicting_duplicates}), steps)
    create_sites_group(run_dir, [int(s) for s in arrays.steps], _site_infos(arrays))

    fingerprints = statistic_fingerprints(arrays.values, arrays.present, arrays.stats)
    stats = _workbench_stats(arrays)
    for start in range(0, len(arrays.steps), _BLOCK):
        write_site_rows(run_dir, start, stats[start:start + _BLOCK], fingerprints[start:start + _BLOCK])

    write_unlogged_scalars(run_dir, steps)
    set_status(run_dir, layout.Status.COMPLETE)
    return run_dir


def write_unlogged_scalars(run_dir: Path, steps: int) -> None:
    """Per-step scalars for an import that has none: NaN (integer fields 0) at every step, each step marked
    written, so the store reads as complete; the manifest says they were not logged (``layout.SCALARS_LOGGED``),
    so that no reader takes them for a NaN loss."""
    writer = ScalarWriter(run_dir, flush_every=max(1, min(steps, SCALAR_ROWS_AT_ONCE)))
    no_scalars = {field: (0 if dtype.startswith("int") else np.nan) for field, dtype in layout.SCALAR_FIELDS.items()}
    for step in range(steps):
        writer.append(step, no_scalars)
    writer.close()
    update_manifest(run_dir, **{layout.SCALARS_LOGGED: False})


def _site_infos(arrays: TableArrays) -> list[SiteInfo]:
    count = arrays.values[..., arrays.stats.index("count")] if "count" in arrays.stats else None  # [step, site]
    infos = []
    for i, site in enumerate(arrays.sites):
        kind, name = split_site(site)
        layer = layer_of(name)
        logged = count[:, i][np.isfinite(count[:, i])] if count is not None else np.empty(0)
        infos.append(SiteInfo(site=site, kind=kind, name=name, layer=-1 if layer is None else layer, order=i,
                              shape="", dtype="", numel=int(logged[0]) if logged.size else 0))
    return infos

"""A folder of runs opened once, with their roles and cached comparisons: what notebooks, widgets,
the study summary and the report read from.

    ws = Workspace.open("data/runs/demo")
    ws.names, ws.roles.reference, ws.roles.floor_runs # roles, found from the runs' manifests
    ws.comparison("det-r0", "tp2")                    # cached analysis.compare
    ws.scalar("loss"), ws.scalar_floor("loss")        # per-run Series, noise-floor envelope
    ws.roles.seed_runs, ws.scalar_seed_spread("loss") # runs that differ only in seed, their envelope
    ws.provenance(["det-r0", "tp2"])                  # for figure footers
    ws.anomalies("tp2")                               # cached analysis.anomalies.find_anomalies

Opening reads manifests and fingerprints; statistics stay lazy until a result needs them, or
until ``preload`` reads them in the background (the widgets do, for the runs they show).
The roles (``ws.roles``: reference, repeats, noise floor, seed runs, source runs, ...) are a pure
function of the manifests (``studies.roles.find_roles``); the workspace holds the caches, behind one
lock, and hands the analysis to the free functions of ``analysis/``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import cached_property, partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import pandas as pd
import xarray as xr

from workbench.analysis.anomalies import AnomalyRules, find_anomalies
from workbench.analysis.compare import Comparison, compare, compare_runs
from workbench.analysis.cost import COLUMNS as COST_COLUMNS
from workbench.analysis.cost import ThroughputSample, determinism_cost
from workbench.analysis.elementwise import ElementwiseDifference, elementwise_difference
from workbench.analysis.ladder import Ladder, ladder_of
from workbench.analysis.noise_floor import NoiseFloor, leaves_floor, noise_floor
from workbench.analysis.pairs import PairMatrix, pair_matrix
from workbench.analysis.scales import judge_against_scales
from workbench.analysis.sources import COLUMNS as SOURCE_COLUMNS
from workbench.analysis.sources import attribution, source_cost
from workbench.errors import ArgumentError, RunNotFoundError
from workbench.statistics import STAT_NAMES
from workbench.store import chunk_files, layout
from workbench.store.manifest import RUNNER, Provenance
from workbench.store.reader import Run, find_runs, open_run
from workbench.store.records import RunRecords
from workbench.studies.roles import Roles, find_roles

DEMO_RUNS = Path("data/runs/demo")
PRELOAD_ENV = "WORKBENCH_PRELOAD_MB"
DEFAULT_PRELOAD_MB = 2048
"""How much memory ``Workspace.preload`` may fill with statistics read ahead in the background."""
KEPT_STATISTICS = 2
"""Statistics kept in memory per run whose store reads one statistic at a time (schema 3): the one shown and
the one before it. Asking for a third drops the oldest, with the relative differences computed from it (read
again when asked for: a statistic reads on its own)."""
K = TypeVar("K")
V = TypeVar("V")


def runs_dir() -> Path:
    """Where notebooks look for runs: ``$WORKBENCH_RUNS``, else the demo's folder in the project."""
    if "WORKBENCH_RUNS" in os.environ:
        return Path(os.environ["WORKBENCH_RUNS"])
    here = Path.cwd()
    for folder in (here, *here.parents):  # notebooks run from notebooks/, the CLI from the project root
        if (folder / "pyproject.toml").is_file():
            return folder / DEMO_RUNS
    return DEMO_RUNS


class Workspace:
    """Runs by name (their folder names), opened once: ``Workspace.open("data/runs/demo")`` opens a folder of
    runs (or run folders), ``Workspace(runs)`` takes runs already open, by name."""

    def __init__(self, runs: dict[str, Run]) -> None:
        if not isinstance(runs, dict) or not all(isinstance(run, Run) for run in runs.values()):
            given = type(runs).__name__ if not isinstance(runs, dict) else "a dict of other values"
            hint = f"; to open the folder, Workspace.open({runs!r})" if isinstance(runs, str | os.PathLike) else ""
            raise ArgumentError(f"Workspace(runs) takes a dict of open runs by name, not {given}{hint}")
        if not runs:
            raise RunNotFoundError("no runs to open")
        self.runs = runs
        self._records: dict[str, RunRecords] = {}
        self._comparisons: dict[tuple[str, str], Comparison] = {}
        self._stat_values: dict[tuple[str, str], xr.DataArray] = {}
        self._scalars: dict[str, pd.DataFrame] = {}
        self._anomalies: dict[tuple[str, AnomalyRules], pd.DataFrame] = {}
        self._ladders: dict[tuple[str, tuple[str, ...], str, bool], Ladder] = {}
        self._recent: dict[str, list[str]] = {}
        """Per run that reads statistics apart: the statistics in ``_stat_values``, oldest first."""
        self._site_series: dict[tuple[str, str, str], pd.Series] = {}
        """(run, statistic, site): the series ``read_site_ahead`` kept, of one site (``_site_ahead``)."""
        self._site_ahead: str | None = None
        self._loading: dict[str, threading.Thread] = {}
        self._ahead: list[threading.Thread] = []
        self._preload_bytes = int(float(os.environ.get(PRELOAD_ENV, DEFAULT_PRELOAD_MB)) * 2**20)
        self._ahead_bytes = self._preload_bytes
        self._lock = threading.Lock()
        """Guards the caches above: the background reads (``preload``, ``read_ahead``) fill them too."""
        self._idle = threading.Condition(self._lock)
        self._foreground = 0
        """Views being drawn (``foreground``): ``read_ahead`` starts no task while one is."""

    @classmethod
    def open(cls, *paths: str | os.PathLike[str]) -> Workspace:
        """Open run folders, or every run under the given folders (replays only when named)."""
        folders: list[Path] = []
        for path in paths:
            path = Path(path)
            if layout.resolve_run_dir(path) is not None:
                folders.append(layout.resolve_run_dir(path))  # type: ignore[arg-type]
            elif path.is_dir():
                found = find_runs(path)
                if not found:
                    raise RunNotFoundError(f"{path}: neither a run nor a folder of runs (no run.zarr under it)")
                # Replays (``workbench replay``/``bisect``) repeat part of a run: opened only when named.
                folders += [f for f in found if open_run(f).manifest.replay is None]
            else:
                raise RunNotFoundError(f"{path}: no such run or folder; the demo's runs are made by `make demo` "
                                       "(or `workbench demo`)")
        if not folders:
            raise RunNotFoundError(f"no runs under {', '.join(map(str, paths))}; the demo's runs are made by "
                                   "`make demo` (or `workbench demo`)")
        return cls({folder.name: open_run(folder) for folder in folders})

    @property
    def names(self) -> list[str]:
        return list(self.runs)

    @cached_property
    def recorded(self) -> list[str]:
        """Runs with per-site records."""
        return [n for n, r in self.runs.items() if r.has_sites]

    def _cached(self, cache: dict[K, V], key: K, compute: Callable[[], V]) -> V:
        """``cache[key]``, computed outside the lock when missing (two threads asking at once may both compute
        it: the value kept is the first one stored, so that every caller sees the same object)."""
        with self._lock:
            if key in cache:
                return cache[key]
        value = compute()
        with self._lock:
            return cache.setdefault(key, value)

    def records(self, name: str) -> RunRecords:
        """The run's records (``Run.records``): its fingerprints in memory, its statistics lazy. Cached, except
        for a store that reads statistics apart (schema 3), whose fingerprints (8 bytes per site and recorded
        step) are read again for each new comparison instead of held for the session (``comparison``, which is
        cached, keeps only which cells are equal, one byte each)."""
        if name not in self.runs:
            raise RunNotFoundError(f"no run {name!r} here; the runs are {', '.join(self.runs)}")
        run = self.runs[name]
        if run.has_sites and run.reads_statistics_apart:
            return run.records(scalars=self.scalars(name))
        return self._cached(self._records, name, run.records)  # NoSitesError without records

    def anomalies(self, name: str, rules: AnomalyRules | None = None) -> pd.DataFrame:
        """``analysis.anomalies.find_anomalies`` of one run (from its scalars alone if it has no records); cached."""
        rules = rules or AnomalyRules()
        records = self.records(name) if self.runs[name].has_sites else None  # None: scalars only
        return self._cached(self._anomalies, (name, rules), lambda: find_anomalies(self.scalars(name), records, rules))

    def pair_matrix(self, names: Iterable[str] | None = None) -> PairMatrix:
        """The first divergent step of every pair of ``names`` (default: every recorded run); each run's records
        read once for all its pairs."""
        held: dict[str, RunRecords] = {}

        def records(name: str) -> RunRecords:
            if name not in held:
                held[name] = self.records(name)
            return held[name]

        return pair_matrix(list(names) if names is not None else self.recorded,
                           lambda a, b: self.comparison(a, b, records=records))

    def comparison(self, a: str, b: str, *, records: Callable[[str], RunRecords] | None = None,
                   cells: bool = False) -> Comparison:
        """``analysis.compare`` of two runs; cached. Two stores that read statistics apart (schema 3, whose records
        are not held) are compared from their folds (``analysis.compare.compare_runs``), their fingerprints read
        whole only for ``Comparison.equal``, unless the caller says it reads ``equal`` (``cells``: a heatmap),
        which the fingerprints read whole give sooner; others from their records: ``records``, where to get them
        (default ``self.records``)."""
        get = records or self.records

        def compute() -> Comparison:
            if a not in self.runs or b not in self.runs:
                raise RunNotFoundError(f"no run {a if a not in self.runs else b!r} here; the runs are "
                                       f"{', '.join(self.runs)}")
            runs = self.runs[a], self.runs[b]
            folded = (compare_runs(*runs) if not cells and all(r.has_sites and r.reads_statistics_apart for r in runs)
                      else None)
            return folded if folded is not None else compare(get(a), get(b))

        return self._cached(self._comparisons, (a, b), compute)

    # -- roles -----------------------------------------------------------------------

    @cached_property
    def roles(self) -> Roles:
        """What each run is for (``studies.roles``), from the manifests alone."""
        return find_roles({name: run.manifest for name, run in self.runs.items()}, self.recorded)

    def trained_here(self, name: str) -> bool:
        """Whether the workbench's runner trained ``name`` (so that replay and bisect can retrain it)."""
        return self.runs[name].manifest.producer == RUNNER

    def attribution(self, *, stat: str = "l2", warmup: int = 2, interval: float = 95.0) -> pd.DataFrame:
        """``analysis.sources.attribution``: the first run of each source against the reference, with the noise
        floor, and what the source costs in tokens/s (``source_cost``); empty without source runs."""
        if not self.roles.source_runs:
            return pd.DataFrame(columns=SOURCE_COLUMNS)
        first: dict[str, str] = {}  # the first run of each source: its row
        for name, label in sorted(self.roles.source_runs.items()):
            first.setdefault(label, name)
        summary = self.ladder(list(first.values()), stat=stat).summary
        cost = self.source_cost(warmup=warmup, interval=interval)
        return attribution(summary, {name: label for label, name in first.items()}, cost)

    def source_cost(self, *, measure: str = "tokens_per_s", warmup: int = 2, interval: float = 95.0) -> pd.DataFrame:
        """``analysis.sources.source_cost``: each source's runs against the all-off runs of the reference's
        configuration, in tokens/s or (``measure="step_time"``) steps/s; empty without both."""
        _check_measure(measure)
        rates: dict[str, list[np.ndarray]] = {}
        for name, label in self.roles.source_runs.items():
            rates.setdefault(label, []).append(self._rate(name, measure))
        baseline = [self._rate(n, measure) for n in self.roles.all_off_runs] if rates else []
        if not baseline:
            return pd.DataFrame(columns=COST_COLUMNS)
        return source_cost(rates, baseline, warmup=warmup, interval=interval)

    @property
    def on_cpu(self) -> bool:
        """Whether any run here says it ran on a CPU (where nondeterminism is emulated and costs are the
        emulation's); runs that do not say (imported ones) do not count."""
        return any(str(r.manifest.runtime.get("device", "cpu")).startswith("cpu") for r in self.runs.values()
                   if r.manifest.runtime)

    @cached_property
    def floor(self) -> NoiseFloor | None:
        """The noise floor of the noise-floor runs' records (``analysis.noise_floor``); None without them."""
        return noise_floor([self.records(n) for n in self.roles.floor_runs]) if self.roles.floor_runs else None

    # -- analysis over several runs ----------------------------------------------------

    def ladder(self, names: Iterable[str], *, reference: str | None = None, stat: str = "l2",
               floor: bool = True) -> Ladder:
        """``names`` against the reference (default: the workspace's), per layer, with the noise floor; cached,
        and computed from the cached comparisons. A pair of stores that read statistics apart (schema 3) reads
        ``stat`` for it and drops it, and the relative difference computed from it; other stores' statistics
        are cached (``stat_values``), and their relative differences kept."""
        reference, chosen = reference or self.roles.reference, tuple(names)

        def compute() -> Ladder:
            comparisons = [self.comparison(reference, n) for n in chosen]
            apart = [self.runs[reference].reads_statistics_apart and self.runs[n].reads_statistics_apart
                     for n in chosen]
            held = self.peek_stat_values(reference, stat) if any(apart) else None
            for name, result, dropped in zip(chosen, comparisons, apart, strict=True):
                if dropped:
                    result.relative(stat, (held, self.peek_stat_values(name, stat)))  # type: ignore[arg-type]
                else:
                    self.relative_difference(reference, name, stat)  # from the cached stat_values
            checks = ({n: leaves_floor(self.records(n), self.floor) for n in chosen}
                      if floor and self.floor is not None else {})
            try:
                return ladder_of(reference, comparisons, stat=stat, floor_checks=checks)
            finally:
                for result, dropped in zip(comparisons, apart, strict=True):
                    if dropped:
                        result.forget(stat)

        return self._cached(self._ladders, (reference, chosen, stat, floor), compute)

    def noise_ladder(self, *, reference: str | None = None, stat: str = "l2") -> Ladder | None:
        """The noise-floor runs against the reference: how far apart mere repeats drift."""
        reference = reference or self.roles.reference
        repeats = [n for n in self.roles.floor_runs if n != reference]
        return self.ladder(repeats, reference=reference, stat=stat, floor=False) if repeats else None

    def seed_ladder(self, *, reference: str | None = None, stat: str = "l2") -> Ladder | None:
        """The other seeds against the reference (or, when the reference has none, against the first of the
        seed runs): how far apart runs that differ only in their seed are, layer by layer."""
        recorded = [n for n in self.roles.seed_runs if n in self.recorded]
        base = reference or self.roles.reference
        base = base if base in recorded else (recorded[0] if recorded else base)
        seed = self.runs[base].manifest.seed
        others = [n for n in recorded if self.runs[n].manifest.seed != seed]
        return self.ladder(others, reference=base, stat=stat, floor=False) if others else None

    def cost(self, *, measure: str = "tokens_per_s", warmup: int = 2, interval: float = 95.0,
             configs: Iterable[str] | None = None) -> pd.DataFrame:
        """Determinism tax per configuration (``analysis.cost.determinism_cost``), from tokens per second
        (the recorder's time left out) or, with ``measure="step_time"``, from steps per second."""
        _check_measure(measure)
        wanted = set(configs) if configs is not None else None
        samples = [ThroughputSample(run.manifest.configuration(), bool(run.manifest.deterministic),
                                    self._rate(name, measure))
                   for name, run in self.runs.items()
                   if name not in self.roles.faulted and run.manifest.deterministic is not None
                   and (wanted is None or run.manifest.configuration() in wanted)]
        return determinism_cost(samples, warmup=warmup, interval=interval)

    def _rate(self, name: str, measure: str) -> np.ndarray:
        """Per step: tokens/s (``tokens_per_s``), or steps/s from the step time (``step_time``)."""
        values = self.scalars(name)[measure].to_numpy(dtype=float)
        return values if measure == "tokens_per_s" else 1.0 / values

    def scales(self, column: str = "val_loss", names: Iterable[str] | None = None) -> tuple[int | None, pd.DataFrame]:
        """``analysis.scales.judge_against_scales`` of ``column`` at the last step where the reference, the
        runs (default: ``others``), the noise-floor and the seed runs all have a value; (None, empty) if none."""
        names = list(names) if names is not None else self.roles.others
        involved = list(dict.fromkeys([self.roles.reference, *names, *self.roles.floor_runs, *self.roles.seed_runs]))
        table = pd.DataFrame(self.scalar(column, involved)).dropna()
        if table.empty or not names:
            return None, judge_against_scales({}, reference=self.roles.reference, runs=[], floor_runs=[], seed_runs=[])
        step = int(table.index[-1])
        final = {name: float(table.loc[step, name]) for name in involved}
        roles = self.roles
        return step, judge_against_scales(final, reference=roles.reference, runs=names, floor_runs=roles.floor_runs,
                                          seed_runs=roles.seed_runs)

    @property
    def configurations(self) -> list[str]:
        """The configurations (apart from the determinism switch) of the runs, for the cost view."""
        return sorted({r.manifest.configuration() for n, r in self.runs.items() if n not in self.roles.faulted})

    # -- views -----------------------------------------------------------------------

    def scalar(self, column: str = "loss", names: Iterable[str] | None = None) -> dict[str, pd.Series]:
        """One per-step scalar (``loss``, ``grad_norm``, ``step_time`` ...) of each run."""
        return {n: self.scalars(n)[column] for n in (self.names if names is None else names)}

    def scalars(self, name: str) -> pd.DataFrame:
        """``Run.scalars`` of one run, read once (a workspace is a view of its runs as they were when opened)."""
        return self._cached(self._scalars, name, lambda: self.runs[name].scalars)

    def scalar_floor(self, column: str = "loss") -> tuple[pd.Series, pd.Series] | None:
        """The envelope (min, max per step) of a scalar over the noise-floor runs."""
        return self.scalar_band(column, self.roles.floor_runs)

    def scalar_seed_spread(self, column: str = "loss") -> tuple[pd.Series, pd.Series] | None:
        """The envelope (min, max per step) of a scalar over the seed runs: the seed-to-seed spread."""
        return self.scalar_band(column, self.roles.seed_runs)

    def scalar_band(self, column: str, names: Iterable[str]) -> tuple[pd.Series, pd.Series] | None:
        """The envelope (min, max per step, over the runs that have a value) of a scalar; None for no runs."""
        names = list(names)
        return _envelope(self.scalar(column, names)) if names else None

    def stat_values(self, name: str, stat: str) -> xr.DataArray:
        """One statistic of every site and step of a run, in memory (step, site); cached (the latest
        ``KEPT_STATISTICS`` of a run that reads statistics apart, ``Run.reads_statistics_apart``). One not
        read yet is read now, unless the background read of them all (``preload``, for older stores) is under
        way: each chunk of such a store holds every statistic, so a second read beside it would only slow
        both down."""
        loading = self._loading.get(name)
        if loading is not None:
            loading.join()
        # not preloaded, or the background read failed: read it now
        values = self._cached(self._stat_values, (name, stat), lambda: self.runs[name].statistic(stat))
        if self.runs[name].reads_statistics_apart:
            self._keep_recent(name, stat)
        return values

    def peek_stat_values(self, name: str, stat: str, steps: tuple[int, int] | None = None) -> xr.DataArray:
        """``stat_values`` without changing the cache: the cached values when held, else read and not kept (for
        work that must not hold or push out a run's statistic). ``steps`` (first, last): those steps only."""
        with self._lock:
            held = self._stat_values.get((name, stat))
        if held is None:
            return self.runs[name].statistic(stat, steps)
        return held if steps is None else held.sel(step=slice(*steps))

    def _keep_recent(self, name: str, stat: str) -> None:
        """Mark ``stat`` of ``name`` the latest used; drop the statistics beyond ``KEPT_STATISTICS``, and the
        relative differences computed from them."""
        with self._lock:
            recent = self._recent.setdefault(name, [])
            if stat in recent:
                recent.remove(stat)
            recent.append(stat)
            while len(recent) > KEPT_STATISTICS:
                old = recent.pop(0)
                self._stat_values.pop((name, old), None)
                for pair, comparison in self._comparisons.items():
                    if name in pair:
                        comparison.forget(old)

    def preload(self, names: Iterable[str]) -> list[str]:
        """Read every statistic of the recorded runs among ``names`` into memory in the background, one pass
        over each store, while they fit in ``$WORKBENCH_PRELOAD_MB`` (default 2048 MiB) together; returns the
        runs being read. Only for stores that keep every statistic in one chunk (schemas 1 and 2), where reading
        one costs as much as reading all; a store that reads one statistic at a time is read when asked."""
        started = []
        for name in dict.fromkeys(names):
            if name in self._loading or name not in self.recorded or self.runs[name].reads_statistics_apart:
                continue
            size = self.runs[name].stats_nbytes  # from the store's metadata: the records are read in the thread
            if size > self._preload_bytes:
                continue
            self._preload_bytes -= size
            thread = threading.Thread(target=self._load_every_stat, args=(name,), name=f"preload-{name}",
                                      daemon=True)
            self._loading[name] = thread
            thread.start()
            started.append(name)
        return started

    def read_ahead(self, tasks: Iterable[Callable[[], int]]) -> None:
        """Run ``tasks`` one after another in the background, once the statistics ``preload`` reads are in:
        the views a widget may show next (each task computes and caches one, and returns the bytes it keeps
        beyond the relative differences, which ``derived_bytes`` counts), while they fit in as much memory
        again as ``preload`` may fill. A task that fails is skipped: its view
        fails again, with its message, when it is asked for."""
        tasks = list(tasks)

        def run() -> None:
            for thread in list(self._loading.values()):
                thread.join()
            for task in tasks:
                self._wait_for_views()
                if self._ahead_bytes - self.derived_bytes() <= 0:
                    return
                try:
                    with chunk_files.yielding(self._wait_for_views):  # and inside its reads, file by file
                        self._ahead_bytes -= task()
                except Exception:  # noqa: BLE001, S112 - see the docstring
                    continue

        thread = threading.Thread(target=run, name="read-ahead", daemon=True)
        self._ahead.append(thread)
        thread.start()

    def _wait_for_views(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._foreground == 0)

    @contextmanager
    def foreground(self) -> Iterator[None]:
        """A view being drawn: ``read_ahead`` waits, before its next task and before each file its task reads
        from a store's chunk files, until no view is, so that the view's reads have the cores and the disk."""
        with self._idle:
            self._foreground += 1
        try:
            yield
        finally:
            with self._idle:
                self._foreground -= 1
                self._idle.notify_all()

    @contextmanager
    def behind_background(self) -> Iterator[None]:
        """Inside ``foreground``: a view that waits for the background's work lets it run meanwhile."""
        with self._idle:
            self._foreground -= 1
            self._idle.notify_all()
        try:
            yield
        finally:
            with self._idle:
                self._foreground += 1

    def derived_bytes(self) -> int:
        """Memory held by the relative differences the cached comparisons computed."""
        with self._lock:
            comparisons = list(self._comparisons.values())
        return sum(c.relative_bytes() for c in comparisons)

    def preloaded(self, timeout: float | None = None) -> bool:
        """Wait (up to ``timeout`` seconds each) for the background reads and read-aheads; whether they have all
        finished."""
        threads = [*self._loading.values(), *self._ahead]
        for thread in threads:
            thread.join(timeout)
        return not any(t.is_alive() for t in threads)

    def _load_every_stat(self, name: str) -> None:
        try:
            stats = self.records(name).stats.load()
        except Exception:  # noqa: BLE001 - a damaged store: stat_values reads it again and raises in the caller
            return
        for stat in stats["stat"].to_numpy().tolist():
            values = stats.sel(stat=stat).copy()
            with self._lock:
                self._stat_values.setdefault((name, str(stat)), values)

    def relative_difference(self, a: str, b: str, stat: str) -> xr.DataArray:
        """``comparison(a, b).relative(stat)``, computed (once) from the cached statistics of the two runs."""
        return self.comparison(a, b).relative(stat, (self.stat_values(a, stat), self.stat_values(b, stat)))

    def site_series(self, site: str, stat: str = "l2", names: Iterable[str] | None = None, *,
                    keep_statistic: bool = True) -> dict[str, pd.Series]:
        """One statistic of one site over steps, per run: the series kept for it (``read_site_ahead``,
        ``keep_site_series``), else from the cached ``stat_values``; with ``keep_statistic=False`` a run's
        statistic not cached is read and dropped instead, and the series kept when ``site`` is the one followed
        (``follow_site``)."""
        series = {}
        for name in self.recorded if names is None else names:
            with self._lock:
                kept = self._site_series.get((name, stat, site))
            if kept is not None:
                series[name] = kept
                continue
            values = self.stat_values(name, stat) if keep_statistic else self.peek_stat_values(name, stat)
            if site in values.indexes["site"]:
                series[name] = values.sel(site=site).to_series()
                if not keep_statistic:
                    self._keep_series(name, stat, site, series[name])
        return series

    def read_site_ahead(self, site: str, names: Iterable[str], stats: Iterable[str] = STAT_NAMES) -> None:
        """Each of ``stats`` (default: every statistic) of ``site`` in the runs among ``names`` that read
        statistics apart, in the background (``read_ahead``): each statistic read once and dropped, the site's
        series kept, so that ``site_series`` of another statistic reads nothing. For one site at a time: a
        later call drops the series of the earlier site and the reads still queued for it."""
        chosen = [n for n in dict.fromkeys(names) if n in self.recorded and self.runs[n].reads_statistics_apart]
        self.follow_site(site)

        def task(name: str, stat: str) -> int:
            with self._lock:
                if self._site_ahead != site or (name, stat, site) in self._site_series:
                    return 0
            return self.keep_site_series(site, stat, {name: self.peek_stat_values(name, stat)})

        self.read_ahead([partial(task, name, stat) for stat in stats for name in chosen])

    def keep_site_series(self, site: str, stat: str, values: dict[str, xr.DataArray]) -> int:
        """Keep ``site``'s series of ``stat`` from runs' (step, site) ``values`` read for other work, for
        ``site_series`` (one site at a time, as ``read_site_ahead``: another site's series are dropped, and
        nothing is kept for a site no longer the one read ahead); the bytes kept."""
        kept = 0
        for name, run_values in values.items():
            if site not in run_values.indexes["site"]:
                continue
            series = run_values.sel(site=site).to_series()
            if not self._keep_series(name, stat, site, series):
                return kept
            kept += int(series.nbytes)
        return kept

    def _keep_series(self, name: str, stat: str, site: str, series: pd.Series) -> bool:
        """Keep ``series`` of ``site`` if it is the site followed; whether it was."""
        with self._lock:
            if self._site_ahead != site:
                return False
            self._site_series[(name, stat, site)] = series
            return True

    def follow_site(self, site: str) -> None:
        """Make ``site`` the one whose series ``keep_site_series`` keeps, dropping another site's."""
        with self._lock:
            if self._site_ahead != site:
                self._site_series = {k: v for k, v in self._site_series.items() if k[2] == site}
            self._site_ahead = site

    def site_band(self, site: str, stat: str, names: Iterable[str]) -> tuple[pd.Series, pd.Series] | None:
        """The envelope (min, max per step) of one site's statistic over the recorded runs among ``names``."""
        names = [n for n in names if n in self.recorded]
        return _envelope(self.site_series(site, stat, names)) if names else None

    def snapshot_differences(self, a: str, b: str, step: int,
                             sites: Iterable[str] | None = None) -> dict[str, ElementwiseDifference]:
        """Element-wise measures of every site both runs snapshotted at ``step``."""
        common = sorted(set(self.runs[a].snapshots().get(step, [])) & set(self.runs[b].snapshots().get(step, [])))
        wanted = [s for s in common if sites is None or s in set(sites)]
        return {s: elementwise_difference(self.runs[a].snapshot(step, s), self.runs[b].snapshot(step, s),
                                          self.runs[a].snapshot_dtype(step, s)) for s in wanted}

    def provenance(self, names: Iterable[str] | None = None) -> Provenance:
        runs = [self.runs[n] for n in (self.names if names is None else names)]
        revisions = sorted({str(r.attrs.get("git_revision")) for r in runs if r.attrs.get("git_revision")})
        return Provenance(runs=tuple(r.run_id for r in runs),
                          configs=tuple(dict.fromkeys(r.manifest.summary() for r in runs)),
                          schema_version=int(runs[0].attrs.get("schema_version", layout.SCHEMA_VERSION)
                                             if runs else layout.SCHEMA_VERSION),
                          revision=", ".join(revisions) or None)


def _check_measure(measure: str) -> None:
    if measure not in ("tokens_per_s", "step_time"):
        raise ArgumentError(f"measure {measure!r}: tokens_per_s or step_time")


def _envelope(series: dict[str, pd.Series]) -> tuple[pd.Series, pd.Series] | None:
    """(min, max) per step over the runs' series that have a value there; None without any series."""
    table = pd.DataFrame(series)
    return (table.min(axis=1), table.max(axis=1)) if not table.empty else None

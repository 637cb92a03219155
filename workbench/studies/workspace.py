"""A folder of runs opened once: what notebooks, widgets, the study summary and the report read from.

    ws = Workspace.open("data/runs/demo")
    ws.names, ws.roles.reference, ws.roles.floor_runs  # roles, from the runs' manifests
    ws.comparison("det-r0", "tp2"), ws.ladder(["tp2"])  # held once computed
    ws.scalar("loss"), ws.scalar_floor("loss"), ws.provenance(["det-r0", "tp2"])

A facade: each method forwards to one part with one concern. ``holding`` (``studies.holding``) keeps what was
computed or read, behind one lock and within a byte budget; ``ahead`` (``studies.reading_ahead``) reads in the
background, a drawn view first; ``studies.comparing`` compares two stores, ``studies.measures`` measures many runs,
``studies.reads`` and ``studies.heatmaps`` read and compute what the views draw; the analysis is ``analysis/``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from functools import cached_property, partial
from pathlib import Path

import pandas as pd
import xarray as xr

from workbench.analysis.anomalies import AnomalyRules, find_anomalies
from workbench.analysis.compare import Comparison
from workbench.analysis.elementwise import ElementwiseDifference
from workbench.analysis.ladder import Ladder
from workbench.analysis.noise_floor import NoiseFloor, noise_floor
from workbench.analysis.pairs import PairMatrix, pair_matrix
from workbench.errors import ArgumentError, RunNotFoundError
from workbench.figures.divergence import StepBins
from workbench.statistics import STAT_NAMES
from workbench.store.manifest import RUNNER, Provenance
from workbench.store.reader import Run, Skipped, open_runs, provenance
from workbench.store.records import RunRecords
from workbench.studies import heatmaps, measures, reads
from workbench.studies.comparing import compare_stores
from workbench.studies.holding import KEPT_STATISTICS, Holding
from workbench.studies.reading_ahead import Pause, ReadAhead, Task
from workbench.studies.roles import Roles, find_roles
from workbench.studies.verdicts import VERDICT_COLUMNS, verdict_table

DEMO_RUNS = Path("data/runs/demo")
PRELOAD_ENV = "WORKBENCH_PRELOAD_MB"
DEFAULT_PRELOAD_MB = 2048
"""How much memory ``Workspace.preload`` may fill with statistics read ahead in the background (and the reads ahead
of views as much again)."""


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
        self.holding = Holding(int(float(os.environ.get(PRELOAD_ENV, DEFAULT_PRELOAD_MB)) * 2**20))
        self.ahead = ReadAhead()

    @classmethod
    def open(cls, *paths: str | os.PathLike[str], on_skip: Skipped | None = None) -> Workspace:
        """Open run folders, or every run under the given folders (replays only when named); a run under a folder
        that cannot be read is handed to ``on_skip`` with the reason and left out, if given (else refused)."""
        return cls({run.path.name: run for run in open_runs(*paths, on_skip=on_skip)})

    @property
    def names(self) -> list[str]:
        return list(self.runs)

    @cached_property
    def recorded(self) -> list[str]:
        """Runs with per-site records."""
        return [n for n, r in self.runs.items() if r.has_sites]

    def _run(self, name: str) -> Run:
        if name not in self.runs:
            raise RunNotFoundError(f"no run {name!r} here; the runs are {', '.join(self.runs)}")
        return self.runs[name]

    def records(self, name: str) -> RunRecords:
        """The run's records (``Run.records``); held, but for a store that reads statistics apart, whose
        fingerprints are read again for each new comparison (which is held, one byte per cell)."""
        run = self._run(name)
        if run.has_sites and run.reads_statistics_apart:
            return run.records(scalars=self.scalars(name))
        return self.holding.get("records", name, run.records)  # NoSitesError without records

    def anomalies(self, name: str, rules: AnomalyRules | None = None) -> pd.DataFrame:
        """``analysis.anomalies.find_anomalies`` of one run (from its scalars alone if it has no records); held."""
        rules = rules or AnomalyRules()
        records = self.records(name) if self.runs[name].has_sites else None  # None: scalars only
        return self.holding.get("anomalies", (name, rules), lambda: find_anomalies(
            self.scalars(name), records, rules, scalars_logged=self.runs[name].logs_scalars))

    def pair_matrix(self, names: Iterable[str] | None = None) -> PairMatrix:
        """The first divergent step of every pair of ``names`` (default: every recorded run)."""
        held: dict[str, RunRecords] = {}

        def records(name: str) -> RunRecords:
            return held[name] if name in held else held.setdefault(name, self.records(name))

        return pair_matrix(list(names) if names is not None else self.recorded,
                           lambda a, b: self.comparison(a, b, records=records))

    def comparison(self, a: str, b: str, *, records: Callable[[str], RunRecords] | None = None,
                   cells: bool = False) -> Comparison:
        """``studies.comparing.compare_stores`` of two runs, held: from their folds where both stores have them,
        unless the caller reads every cell (``cells``: a heatmap); else from their records (``records``: where
        to get them, default ``self.records``)."""
        get = records or self.records
        runs = self._run(a), self._run(b)
        return self.holding.get("comparisons", (a, b), lambda: compare_stores(
            *runs, cells=cells, records=lambda run: get(a if run is runs[0] else b)))

    # -- roles and measures ----------------------------------------------------------

    @cached_property
    def roles(self) -> Roles:
        """What each run is for (``studies.roles``), from the manifests alone."""
        return find_roles({name: run.manifest for name, run in self.runs.items()}, self.recorded)

    def trained_here(self, name: str) -> bool:
        """Whether the workbench's runner trained ``name`` (so that replay and bisect can retrain it)."""
        return self.runs[name].manifest.producer == RUNNER

    def attribution(self, *, stat: str = "l2", warmup: int = 2, interval: float = 95.0) -> pd.DataFrame:
        """Each nondeterminism source's first run against the reference, and its cost (``studies.measures``)."""
        return measures.attribution(self, stat=stat, warmup=warmup, interval=interval)

    def source_cost(self, *, measure: str = "tokens_per_s", warmup: int = 2, interval: float = 95.0) -> pd.DataFrame:
        """What each nondeterminism source costs, in tokens/s or (``measure="step_time"``) steps/s."""
        return measures.source_cost(self, measure=measure, warmup=warmup, interval=interval)

    def cost(self, *, measure: str = "tokens_per_s", warmup: int = 2, interval: float = 95.0,
             configs: Iterable[str] | None = None) -> pd.DataFrame:
        """Determinism tax per configuration (``analysis.cost.determinism_cost``), from tokens per second
        (the recorder's time left out) or, with ``measure="step_time"``, from steps per second."""
        return measures.cost(self, measure=measure, warmup=warmup, interval=interval, configs=configs)

    def scales(self, column: str = "val_loss", names: Iterable[str] | None = None) -> tuple[int | None, pd.DataFrame]:
        """Each run's ``column`` judged against the noise floor and the seed spread (``studies.measures.scales``)."""
        return measures.scales(self, column, names)

    def verdicts(self, names: Iterable[str] | None = None) -> pd.DataFrame:
        """Bug or rounding: each of ``names`` (default: the precision and layout runs) against the reference's
        rounding band, its band runs and nondeterministic repeats (``studies.verdicts.verdict_table``; empty
        without two band runs)."""
        roles, chosen = self.roles, list(self.roles.others if names is None else names)
        if len(roles.band_runs) < 2 or not chosen:
            return pd.DataFrame(columns=VERDICT_COLUMNS)
        recorded = {name: self.runs[name] for name in roles.recorded}
        return self.holding.get("verdicts", tuple(chosen), partial(
            verdict_table, recorded, roles.reference, chosen, self.records))

    @property
    def on_cpu(self) -> bool:
        """Whether any run says it ran on a CPU (where nondeterminism and its cost are emulated)."""
        return any(str(r.manifest.runtime.get("device", "cpu")).startswith("cpu") for r in self.runs.values()
                   if r.manifest.runtime)

    @property
    def configurations(self) -> list[str]:
        """The configurations (apart from the determinism switch) of the runs, for the cost view."""
        return sorted({r.manifest.configuration() for n, r in self.runs.items() if n not in self.roles.faulted})

    @cached_property
    def floor(self) -> NoiseFloor | None:
        """The noise floor of the noise-floor runs' records (``analysis.noise_floor``); None without them."""
        return noise_floor([self.records(n) for n in self.roles.floor_runs]) if self.roles.floor_runs else None

    def ladder(self, names: Iterable[str], *, reference: str | None = None, stat: str = "l2", floor: bool = True,
               pause: Pause | None = None) -> Ladder:
        """``names`` against the reference (default: the workspace's), per layer, with the noise floor; held
        (``studies.measures.ladder``; ``pause``: a background read's)."""
        reference, chosen = reference or self.roles.reference, tuple(names)
        return self.holding.get("ladders", (reference, chosen, stat, floor),
                                partial(measures.ladder, self, reference, chosen, stat, floor, pause))

    def noise_ladder(self, *, reference: str | None = None, stat: str = "l2",
                     pause: Pause | None = None) -> Ladder | None:
        """The noise-floor runs against the reference: how far apart mere repeats drift."""
        return measures.noise_ladder(self, reference or self.roles.reference, stat, pause)

    def band_ladder(self, *, reference: str | None = None, stat: str = "l2",
                    pause: Pause | None = None) -> Ladder | None:
        """The reference's band runs against it: the rounding a correct change may make, per layer."""
        return measures.band_ladder(self, reference or self.roles.reference, stat, pause)

    def seed_ladder(self, *, reference: str | None = None, stat: str = "l2",
                    pause: Pause | None = None) -> Ladder | None:
        """The other seeds against the reference (or the first seed run): how far apart seeds are, per layer."""
        return measures.seed_ladder(self, reference or self.roles.reference, stat, pause)

    # -- scalars -----------------------------------------------------------------------

    def scalar(self, column: str = "loss", names: Iterable[str] | None = None) -> dict[str, pd.Series]:
        """One per-step scalar (``loss``, ``grad_norm``, ``step_time`` ...) of each run."""
        return {n: self.scalars(n)[column] for n in (self.names if names is None else names)}

    def scalars(self, name: str) -> pd.DataFrame:
        """``Run.scalars`` of one run, read once (a workspace is a view of its runs as they were when opened)."""
        return self.holding.get("scalars", name, lambda: self.runs[name].scalars)

    def scalar_floor(self, column: str = "loss") -> tuple[pd.Series, pd.Series] | None:
        """The envelope (min, max per step) of a scalar over the noise-floor runs."""
        return self.scalar_band(column, self.roles.floor_runs)

    def scalar_seed_spread(self, column: str = "loss") -> tuple[pd.Series, pd.Series] | None:
        """The envelope (min, max per step) of a scalar over the seed runs: the seed-to-seed spread."""
        return self.scalar_band(column, self.roles.seed_runs)

    def scalar_band(self, column: str, names: Iterable[str]) -> tuple[pd.Series, pd.Series] | None:
        """The envelope (min, max per step, over the runs that have a value) of a scalar; None for no runs."""
        names = list(names)
        return reads.envelope(self.scalar(column, names)) if names else None

    # -- statistics, held and read ahead --------------------------------------------------

    def stat_values(self, name: str, stat: str) -> xr.DataArray:
        """One statistic of a run (step, site), held (the latest ``KEPT_STATISTICS`` of a run that reads them
        apart); a run being preloaded is waited for rather than read beside its preload."""
        self.ahead.wait_loaded(name)
        run = self._run(name)
        return self.holding.statistic(name, stat, lambda: run.statistic(stat),
                                      kept=KEPT_STATISTICS if run.reads_statistics_apart else None)

    def peek_stat_values(self, name: str, stat: str, steps: tuple[int, int] | None = None, *,
                         pause: Pause | None = None) -> xr.DataArray:
        """``stat_values`` held, else read and not kept (for work that must not hold or push out a run's
        statistic). ``steps`` (first, last): those steps only. ``pause``: a background read's."""
        held = self.holding.peek("statistics", (name, stat))
        if held is None:
            return self._run(name).statistic(stat, steps, pause=pause)
        return held if steps is None else held.sel(step=slice(*steps))

    def preload(self, names: Iterable[str]) -> list[str]:
        """Every statistic of the runs among ``names`` whose stores keep them in one chunk, read in the background
        while they fit in ``$WORKBENCH_PRELOAD_MB`` (default 2048 MiB) together (``studies.reads``)."""
        return reads.preload(self, names)

    def read_ahead(self, tasks: Iterable[Task]) -> None:
        """Run ``tasks`` (views a widget may show next) in the background, after the preloads, while they fit."""
        self.ahead.run(tasks, room=self.holding.room, spend=self.holding.spend)

    def foreground(self) -> AbstractContextManager[None]:
        """A view being drawn: the background waits for it (``ReadAhead.foreground``)."""
        return self.ahead.foreground()

    def preloaded(self, timeout: float | None = None) -> bool:
        """Wait (up to ``timeout`` seconds each) for the background; whether it has finished."""
        return self.ahead.finished(timeout)

    def derived_bytes(self) -> int:
        """Memory held by the relative differences."""
        return self.holding.relative_bytes()

    def relative_difference(self, a: str, b: str, stat: str) -> xr.DataArray:
        """``comparison(a, b).relative(stat)`` from the held statistics of both runs, computed once and held."""
        return self.holding.relative((a, b), stat, lambda: self.comparison(a, b).relative(
            stat, (self.stat_values(a, stat), self.stat_values(b, stat))))

    # -- one site over steps (studies.reads) ----------------------------------------------

    def site_series(self, site: str, stat: str = "l2", names: Iterable[str] | None = None, *,
                    keep_statistic: bool = True) -> dict[str, pd.Series]:
        """One statistic of one site over steps, per run (``keep_statistic=False``: a statistic not held is read
        and dropped, not kept)."""
        return reads.site_series(self, site, stat, names, keep_statistic=keep_statistic)

    def read_site_ahead(self, site: str, names: Iterable[str], stats: Iterable[str] = STAT_NAMES) -> None:
        """``site``'s other statistics, read ahead in the background (one site at a time)."""
        reads.read_site_ahead(self, site, names, stats)

    def keep_site_series(self, site: str, stat: str, values: dict[str, xr.DataArray]) -> int:
        """Keep ``site``'s series of ``stat`` from values read for other work, if it is the site followed."""
        return reads.keep_site_series(self, site, stat, values)

    def follow_site(self, site: str) -> None:
        """Make ``site`` the one whose series are kept, dropping another site's."""
        self.holding.follow(site)

    def site_band(self, site: str, stat: str, names: Iterable[str]) -> tuple[pd.Series, pd.Series] | None:
        """The envelope (min, max per step) of one site's statistic over the recorded runs among ``names``."""
        names = [n for n in names if n in self.recorded]
        return reads.envelope(self.site_series(site, stat, names)) if names else None

    # -- the explorer's views (studies.heatmaps) ------------------------------------------------

    def step_bins(self, a: str, b: str, stat: str, *, site: str | None = None) -> StepBins:
        """The pair's step bins of ``stat`` (a view of every step), computed once and held."""
        return heatmaps.step_bins(self, a, b, stat, site=site)

    def heatmap_matrix(self, a: str, b: str, stat: str, steps: tuple[int, int], *, keep: bool = True) -> pd.DataFrame:
        """The pair's site x step matrix of ``stat`` over ``steps``; the latest two held."""
        return heatmaps.matrix(self, a, b, stat, steps, keep=keep)

    def read_pair_ahead(self, a: str, b: str, stats: Iterable[str], *, site: str | None = None) -> None:
        """The pair's statistics and the step bins of ``stats``, in the background."""
        heatmaps.read_pair_ahead(self, a, b, stats, site=site)

    def has_step_bins(self, a: str, b: str, stat: str) -> bool:
        return heatmaps.has_step_bins(self, a, b, stat)

    # -- snapshots and provenance ------------------------------------------------------------------

    def snapshot_differences(self, a: str, b: str, step: int,
                             sites: Iterable[str] | None = None) -> dict[str, ElementwiseDifference]:
        """Element-wise measures of every site both runs snapshotted at ``step``."""
        return heatmaps.snapshot_differences(self.runs[a], self.runs[b], step, sites)

    def provenance(self, names: Iterable[str] | None = None) -> Provenance:
        """Where the runs ``names`` (default: all) came from, for a figure's footer."""
        return provenance([self.runs[n] for n in (self.names if names is None else names)])

"""The one view layer: (a workspace, what is asked) -> (a figure, the data it plots). ``workbench figure``, the
report and the widgets ask here, so that one figure is drawn the same way wherever it appears (the noise floor
and the seed-to-seed spread on every trajectory and ladder that has them). A widget's controls are a view's
arguments.

    view = trajectories(ws, "loss")            # every run against the reference, floor and seed bands
    view.figure, view.data                     # a plotly figure; what it plots (one column per run)
    trajectories(ws, "l2", site="param:output_layer.weight", steps=(0, 20), relative=True)
    heatmap(ws, "det-r0", "tp2"), pairs(ws), ladder(ws, stat="max"), sources(ws), cost(ws, measure="step_time")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.anomalies import COLUMNS as ANOMALY_COLUMNS
from workbench.analysis.ladder import Ladder
from workbench.errors import ArgumentError
from workbench.figures.cost import cost_figure
from workbench.figures.divergence import divergence_heatmap, heatmap_matrix
from workbench.figures.ladder import ladder_figure
from workbench.figures.pairs import pairs_figure
from workbench.figures.sources import sources_figure
from workbench.figures.style import run_styles
from workbench.figures.trajectories import trajectory_figure
from workbench.store.layout import TIMING_SCALARS
from workbench.studies.measures import own_band
from workbench.studies.workspace import Workspace

RATES = {"tokens_per_s": "tokens per second", "step_time": "steps per second"}
"""The cost figures' axis for each measure ``Workspace.cost`` takes."""


@dataclass(frozen=True)
class View:
    """A figure and the data it plots (written as CSV by ``workbench figure --data``)."""

    figure: go.Figure
    data: pd.DataFrame
    indexed: bool = True
    """Whether ``data``'s index is part of the data (steps, sites), so that a CSV keeps it."""
    result: Any = None
    """The analysis result drawn, where there is one beyond ``data`` (a ``Ladder``), for a caller that links from
    the figure to it (the ladder widget's clicks)."""


def anomaly_marks(ws: Workspace, names: Iterable[str] | None = None) -> pd.DataFrame:
    """``Workspace.anomalies`` of ``names`` (default: every run) in one table, with a leading ``run`` column."""
    tables = [ws.anomalies(name).assign(run=name) for name in (ws.names if names is None else names)]
    tables = [t for t in tables if not t.empty]  # pandas warns about concatenating empty tables
    if not tables:
        return pd.DataFrame(columns=["run", *ANOMALY_COLUMNS])
    return pd.concat(tables, ignore_index=True)[["run", *ANOMALY_COLUMNS]]


def trajectories(ws: Workspace, quantity: str = "loss", names: Iterable[str] | None = None, *,
                 site: str | None = None, reference: str | None = None, steps: tuple[int, int] | None = None,
                 floor: bool = True, seeds: bool = True, anomalies: bool | pd.DataFrame = False,
                 log_y: bool = False, relative: bool = False, magnitude: bool = True,
                 title: str | None = None) -> View:
    """A per-step scalar (``quantity``), or with ``site`` the statistic ``quantity`` of that site, of ``names``
    (default: every run, the reference first) against ``reference`` (default: the first), within ``steps``
    (inclusive), with the noise floor's, the band runs' and the seed runs' envelopes as bands (none around a timing,
    ``TIMING_SCALARS``) and, with ``anomalies``, each run's anomalies marked (or the marks given). The
    difference panel shows |difference| on a log axis (``magnitude=False``: signed, linear)."""
    chosen = list(names) if names is not None else \
        [ws.roles.reference, *(n for n in ws.names if n != ws.roles.reference)]
    if site is not None:
        series = ws.site_series(site, quantity, [n for n in chosen if n in ws.recorded])
    else:
        series = ws.scalar(quantity, chosen)
    if not series:
        raise ArgumentError("no runs to draw" + (f" with per-site records of {site}" if site is not None else ""))
    low, high = steps if steps is not None else (None, None)
    series = {name: values.loc[low:high] for name, values in series.items()}

    def band(which: list[str]) -> tuple[pd.Series, pd.Series] | None:
        envelope = ws.site_band(site, quantity, which) if site is not None else ws.scalar_band(quantity, which)
        return None if envelope is None else (envelope[0].loc[low:high], envelope[1].loc[low:high])

    if site is None and quantity in TIMING_SCALARS:  # run-to-run numerical bands say nothing about speed
        floor = seeds = False
    marks = anomalies if isinstance(anomalies, pd.DataFrame) else anomaly_marks(ws, series) if anomalies else None
    if title is None and site is not None:  # the site in the title; its axis says the statistic
        title = f"{quantity} of {site} in {len(series)} {'run' if len(series) == 1 else 'runs'}"
    figure = trajectory_figure(series, reference=reference if reference in series else next(iter(series)),
                               quantity=quantity,
                               floor=band(ws.roles.floor_runs) if floor else None,
                               seed_spread=band(ws.roles.seed_runs) if seeds else None,
                               rounding=band(own_band(ws, ws.roles.reference)) if floor else None,
                               log_y=log_y,
                               relative=relative, magnitude=magnitude, anomalies=marks,
                               provenance=ws.provenance(list(series)), title=title, styles=run_styles(ws.names))
    return View(figure, pd.DataFrame(series))


def heatmap(ws: Workspace, a: str, b: str, stat: str = "l2") -> View:
    """Where two runs diverge: site x step, bitwise equal or the log10 relative difference of ``stat``."""
    result = ws.comparison(a, b, cells=True)
    matrix = heatmap_matrix(result, stat, values=(ws.stat_values(a, stat), ws.stat_values(b, stat)))
    return View(divergence_heatmap(result, stat, provenance=ws.provenance([a, b]), matrix=matrix), matrix)


def pairs(ws: Workspace, names: Iterable[str] | None = None) -> View:
    """The first divergent step of every pair of recorded runs."""
    matrix = ws.pair_matrix(names)
    return View(pairs_figure(matrix, provenance=ws.provenance(matrix.names)), matrix.table(), indexed=False,
                result=matrix)


def ladder(ws: Workspace, names: Iterable[str] | None = None, *, reference: str | None = None, stat: str = "l2",
           seeds: bool = True, layers: Callable[[str], bool] | None = None) -> View:
    """``names`` (default: the precision and layout changes) against ``reference`` (default: the workspace's),
    per layer, with the noise floor's, the rounding band's and (with ``seeds``) the seed-to-seed bands, each run's
    verdict (bug or rounding) where the reference has band runs; with ``layers``, only the layers whose label it
    keeps (``L0`` ..., ``embedding``, ``output_layer``, ``loss``)."""
    reference = reference or ws.roles.reference
    chosen = [n for n in (list(names) if names is not None else ws.roles.others) if n != reference]
    if not chosen:
        raise ArgumentError("no runs to set against the reference (no precision or layout change here)")

    def kept(result: Ladder | None) -> Ladder | None:
        if result is None or layers is None:
            return result
        labels = result.per_layer["layer"]  # a row per layer and step: ``layers`` asked once per layer
        chosen = {label: layers(str(label)) for label in labels.unique()}
        return dataclasses.replace(result, per_layer=result.per_layer[labels.map(chosen).astype(bool)])

    result = kept(ws.ladder(chosen, reference=reference, stat=stat))
    assert result is not None
    judged = ws.verdicts(chosen) if reference == ws.roles.reference else None
    verdicts = {str(r.run): _verdict_words(r) for r in judged.itertuples() if r.band} if judged is not None else None
    figure = ladder_figure(result, noise=kept(ws.noise_ladder(reference=reference, stat=stat)),
                           seeds=kept(ws.seed_ladder(reference=reference, stat=stat)) if seeds else None,
                           rounding=kept(ws.band_ladder(reference=reference, stat=stat)), verdicts=verdicts,
                           provenance=ws.provenance([reference, *chosen]), styles=run_styles(ws.names))
    return View(figure, result.summary, indexed=False, result=result)


def _verdict_words(row: Any) -> str:
    """A verdict in a legend's few words: ``within rounding``, or ``beyond rounding, step N`` (``bf16 rounding``
    where it is held to another precision's than fp32's)."""
    rounding = "rounding" if row.rounding == "fp32" else f"{row.rounding} rounding"
    if row.verdict == "unresolved":
        return f"unresolved ({rounding})"
    return f"within {rounding}" if row.verdict == "within rounding" else f"beyond {rounding}, step {row.first_step}"


def sources(ws: Workspace, stat: str = "l2", *, warmup: int = 2, interval: float = 95.0) -> View:
    """Which nondeterminism source matters: each source alone against the reference, and what it costs (the
    first ``warmup`` steps left out, a bootstrap ``interval``)."""
    table = ws.attribution(stat=stat, warmup=warmup, interval=interval)
    if table.empty:
        raise ArgumentError(f"{', '.join(ws.names)}: no run here has a nondeterminism source on alone "
                            "(an attribution study: `workbench sweep workbench/examples/sources.toml`)")
    return View(sources_figure(table, on_cpu=ws.on_cpu, provenance=ws.provenance(), interval=interval), table,
                indexed=False)


def cost(ws: Workspace, *, measure: str = "tokens_per_s", warmup: int = 2, interval: float = 95.0,
         configs: Iterable[str] | None = None) -> View:
    """What deterministic mode costs per configuration (``configs``, default: all), in tokens/s or, with
    ``measure="step_time"``, steps/s; the first ``warmup`` steps left out, a bootstrap ``interval``."""
    table = ws.cost(measure=measure, warmup=warmup, interval=interval, configs=configs)
    if table.empty:
        raise ArgumentError(f"{', '.join(ws.names)}: no configuration here has both a deterministic and a "
                            "nondeterministic run" + (" among those chosen" if configs is not None else ""))
    figure = cost_figure(table, provenance=ws.provenance(), rate=RATES[measure], interval=interval)
    return View(figure, _in_units(table, measure), indexed=False)


def source_cost(ws: Workspace, *, measure: str = "tokens_per_s", warmup: int = 2, interval: float = 95.0) -> View:
    """What making each nondeterminism source deterministic costs, against the runs with every source off."""
    table = ws.source_cost(measure=measure, warmup=warmup, interval=interval)
    if table.empty:
        raise ArgumentError(f"{', '.join(ws.names)}: no runs here with one nondeterminism source on and runs "
                            "with every source off")
    figure = cost_figure(table, provenance=ws.provenance(), rate=RATES[measure], interval=interval,
                         sides=("every source off", "source on"),
                         title="what making each nondeterminism source deterministic costs")
    return View(figure, _in_units(table, measure), indexed=False)


def _in_units(table: pd.DataFrame, measure: str) -> pd.DataFrame:
    """A cost table's rate columns named for what they hold: steps/s when ``measure`` is the step time."""
    if measure != "step_time":
        return table
    sides = ("deterministic", "default")
    return table.rename(columns={f"{side}_tokens_per_s": f"{side}_steps_per_s" for side in sides})

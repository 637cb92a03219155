"""The one view layer: (a workspace, what is asked) -> (a figure, the data it plots). ``workbench figure``, the
report and the notebooks ask here, so that one figure is drawn the same way wherever it appears (the noise floor
and the seed-to-seed spread on every trajectory and ladder that has them).

    view = trajectories(ws, "loss")            # every run against the reference, floor and seed bands
    view.figure, view.data                     # a plotly figure; what it plots (one column per run)
    heatmap(ws, "det-r0", "tp2"), sweep(ws), ladder(ws), sources(ws), cost(ws)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

from workbench.errors import ArgumentError
from workbench.figures.divergence import divergence_heatmap, heatmap_matrix
from workbench.figures.studies import cost_figure, ladder_figure, sources_figure
from workbench.figures.sweep import sweep_figure
from workbench.figures.trajectories import trajectory_figure
from workbench.studies.workspace import Workspace


@dataclass(frozen=True)
class View:
    """A figure and the data it plots (written as CSV by ``workbench figure --data``)."""

    figure: go.Figure
    data: pd.DataFrame
    indexed: bool = True
    """Whether ``data``'s index is part of the data (steps, sites), so that a CSV keeps it."""


def trajectories(ws: Workspace, quantity: str = "loss", names: Iterable[str] | None = None, *,
                 title: str | None = None, anomalies: pd.DataFrame | None = None) -> View:
    """A per-step scalar of ``names`` (default: every run, the reference first), the first being the reference,
    with the noise floor's and the seed runs' envelopes as bands."""
    chosen = list(names) if names is not None else \
        [ws.roles.reference, *(n for n in ws.names if n != ws.roles.reference)]
    if not chosen:
        raise ArgumentError("no runs to draw")
    series = ws.scalar(quantity, chosen)
    figure = trajectory_figure(series, reference=chosen[0], quantity=quantity, floor=ws.scalar_floor(quantity),
                               seed_spread=ws.scalar_seed_spread(quantity), provenance=ws.provenance(chosen),
                               title=title, anomalies=anomalies)
    return View(figure, pd.DataFrame(series))


def heatmap(ws: Workspace, a: str, b: str, stat: str = "l2") -> View:
    """Where two runs diverge: site x step, bitwise equal or the log10 relative difference of ``stat``."""
    result = ws.comparison(a, b)
    matrix = heatmap_matrix(result, stat, relative=ws.relative_difference(a, b, stat))
    return View(divergence_heatmap(result, stat, provenance=ws.provenance([a, b]), matrix=matrix), matrix)


def sweep(ws: Workspace, names: Iterable[str] | None = None) -> View:
    """The first divergent step of every pair of recorded runs."""
    matrix = ws.sweep_matrix(names)
    return View(sweep_figure(matrix, provenance=ws.provenance(matrix.names)), matrix.table(), indexed=False)


def ladder(ws: Workspace, names: Iterable[str] | None = None, *, stat: str = "l2") -> View:
    """``names`` (default: the precision and layout changes) against the reference, per layer, with the noise
    floor's and the seed-to-seed bands."""
    chosen = list(names) if names is not None else ws.roles.others
    if not chosen:
        raise ArgumentError("no runs to set against the reference (no precision or layout change here)")
    result = ws.ladder(chosen, stat=stat)
    figure = ladder_figure(result, noise=ws.noise_ladder(stat=stat), seeds=ws.seed_ladder(stat=stat),
                           provenance=ws.provenance([ws.roles.reference, *chosen]))
    return View(figure, result.summary, indexed=False)


def sources(ws: Workspace, stat: str = "l2") -> View:
    """Which nondeterminism source matters: each source alone against the reference, and what it costs."""
    table = ws.attribution(stat=stat)
    if table.empty:
        raise ArgumentError(f"{', '.join(ws.names)}: no run here has a nondeterminism source on alone "
                            "(an attribution study: `workbench sweep workbench/examples/sources.toml`)")
    return View(sources_figure(table, on_cpu=ws.on_cpu, provenance=ws.provenance()), table, indexed=False)


def cost(ws: Workspace) -> View:
    """What deterministic mode costs per configuration (tokens/s)."""
    table = ws.cost()
    if table.empty:
        raise ArgumentError(f"{', '.join(ws.names)}: no configuration here has both a deterministic and a "
                            "nondeterministic run")
    return View(cost_figure(table, provenance=ws.provenance()), table, indexed=False)

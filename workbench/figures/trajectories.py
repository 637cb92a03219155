"""Trajectories of a scalar (loss, gradient norm, step time ...) or of one site's statistic, for N runs.

    fig = trajectory_figure({"det-r0": loss0, "tp2": loss1}, reference="det-r0",
                            floor=(low, high), quantity="loss")

Pure: pandas Series indexed by step in, a figure out. With a reference the lower panel
shows every other run minus the reference, so differences of 1e-6 on a loss of 2 are
visible; the noise floor (the envelope of repeats of one configuration) is drawn as a
grey band in both panels, the seed-to-seed spread (runs that differ only in seed) as a blue
one. ``anomalies`` (a ``find_anomalies`` table, with a ``run`` column when there are several
runs) are marked on the curves by ``figures.anomaly_marks.mark_anomalies``.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.errors import ArgumentError
from workbench.figures.anomaly_marks import mark_anomalies
from workbench.figures.style import NOISE_FLOOR, SEED_SPREAD, apply_style, floor_band, legend_height, line_style
from workbench.store.manifest import Provenance


def trajectory_figure(series: Mapping[str, pd.Series], *, reference: str | None = None,
                      floor: tuple[pd.Series, pd.Series] | None = None, quantity: str = "loss",
                      log_y: bool = False, provenance: Provenance | None = None,
                      title: str | None = None, anomalies: pd.DataFrame | None = None,
                      relative: bool = False, seed_spread: tuple[pd.Series, pd.Series] | None = None) -> go.Figure:
    """Overlay of ``series`` (run name -> values by step); a difference panel against ``reference``
    (``relative``: the difference divided by the reference's magnitude, signed). ``floor`` and
    ``seed_spread`` are (low, high) envelopes drawn as bands: the noise floor and the seed-to-seed spread."""
    if reference is not None and reference not in series:
        raise ArgumentError(f"reference {reference!r} is not among the runs {', '.join(series)}")
    with_diff = reference is not None and len(series) > 1
    fig = make_subplots(rows=2 if with_diff else 1, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        row_heights=[0.62, 0.38] if with_diff else [1.0])
    bands = [(band, seeds) for band, seeds in ((seed_spread, True), (floor, False)) if band is not None]
    for band, seeds in bands:
        floor_band(fig, list(band[0].index), band[0], band[1], row=1, seeds=seeds,
                   name=SEED_SPREAD if seeds else NOISE_FLOOR)
    for i, (name, values) in enumerate(series.items()):
        width = 2.4 if name == reference else 1.5
        values = values.dropna()  # NaN is not valid JSON for the widget protocol; a gap reads the same
        fig.add_trace(go.Scatter(x=values.index, y=values.to_numpy(), mode="lines", name=name, legendgroup=name,
                                 line=dict(**line_style(i), width=width)), row=1, col=1)
    if with_diff:
        assert reference is not None
        ref = series[reference]

        def difference(values: pd.Series) -> pd.Series:
            base = ref.reindex(values.index)
            return (values - base) / base.abs() if relative else values - base

        for band, seeds in bands:
            floor_band(fig, list(band[0].index), difference(band[0]), difference(band[1]), row=2, show=False,
                       seeds=seeds, name=SEED_SPREAD if seeds else NOISE_FLOOR)
        for i, (name, values) in enumerate(series.items()):
            if name == reference:
                continue
            diff = difference(values).replace([float("inf"), float("-inf")], float("nan")).dropna()
            fig.add_trace(go.Scatter(x=diff.index, y=diff.to_numpy(), mode="lines", name=name, legendgroup=name,
                                     showlegend=False, line=dict(**line_style(i), width=1.5)), row=2, col=1)
        fig.update_yaxes(title=f"relative to {reference}" if relative else f"minus {reference}",
                         exponentformat="power", row=2, col=1)
    apply_style(fig, title=title or f"{quantity} of {len(series)} {'run' if len(series) == 1 else 'runs'}",
                provenance=provenance, height=600 if with_diff else 460)
    fig.update_yaxes(title=quantity, type="log" if log_y else "linear", row=1, col=1)
    fig.update_xaxes(title="step", row=2 if with_diff else 1, col=1)
    if anomalies is not None:
        mark_anomalies(fig, anomalies, row=1, col=1)
    fig.update_layout(height=max(fig.layout.height, legend_height(fig)))  # a legend entry per run, band and mark
    return fig

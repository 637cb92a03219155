"""Trajectories of a scalar (loss, gradient norm, step time ...) or of one site's statistic, for N runs.

    fig = trajectory_figure({"det-r0": loss0, "tp2": loss1}, reference="det-r0",
                            floor=(low, high), quantity="loss")

Pure: pandas Series indexed by step in, a figure out. With a reference the lower panel shows every
other run's difference from the reference: by default its magnitude on a log scale, so that 1e-7 and
1e-1 are both visible (a step where a run equals the reference bitwise is a gap, and a run equal at
every step shown is named in the legend); signed and linear with ``magnitude=False``. The noise floor
(the envelope of repeats of one configuration) is drawn as a grey band in both panels, the seed-to-seed
spread (runs that differ only in seed) as a blue one. ``anomalies`` (a ``find_anomalies`` table, with a
``run`` column when there are several runs) are marked on the curves by
``figures.anomaly_marks.mark_anomalies``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.errors import ArgumentError
from workbench.figures.anomaly_marks import mark_anomalies
from workbench.figures.style import (
    NOISE_FLOOR,
    ROUNDING_BAND,
    SEED_SPREAD,
    RunStyles,
    apply_style,
    floor_band,
    legend_height,
    log_ticks,
    style_of,
)
from workbench.store.manifest import Provenance


def trajectory_figure(series: Mapping[str, pd.Series], *, reference: str | None = None,
                      floor: tuple[pd.Series, pd.Series] | None = None, quantity: str = "loss",
                      log_y: bool = False, provenance: Provenance | None = None,
                      title: str | None = None, anomalies: pd.DataFrame | None = None,
                      relative: bool = False, seed_spread: tuple[pd.Series, pd.Series] | None = None,
                      magnitude: bool = True, rounding: tuple[pd.Series, pd.Series] | None = None,
                      styles: RunStyles | None = None) -> go.Figure:
    """Overlay of ``series`` (run name -> values by step); a difference panel against ``reference``
    (``relative``: the difference divided by the reference's magnitude; ``magnitude``: its absolute value on a
    log axis, else signed on a linear one). ``floor``, ``seed_spread`` and ``rounding`` are (low, high) envelopes
    drawn as bands: the noise floor, the seed-to-seed spread and the rounding band of the reference's band runs
    (in the difference panel as magnitudes: from zero to the larger of the two). ``styles``: each run's line style
    (``style.run_styles`` of a folder's runs: a run keeps its colour whichever runs are drawn); else by order."""
    if reference is not None and reference not in series:
        raise ArgumentError(f"reference {reference!r} is not among the runs {', '.join(series)}")
    with_diff = reference is not None and len(series) > 1
    fig = make_subplots(rows=2 if with_diff else 1, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        row_heights=[0.62, 0.38] if with_diff else [1.0])
    bands = [(band, name) for band, name in ((seed_spread, SEED_SPREAD), (floor, NOISE_FLOOR),
                                              (rounding, ROUNDING_BAND)) if band is not None]
    for band, name in bands:
        floor_band(fig, list(band[0].index), band[0], band[1], row=1, name=name, **_kind(name))
    for i, (name, values) in enumerate(series.items()):
        width = 2.4 if name == reference else 1.5
        values = values.dropna()  # NaN is not valid JSON for the widget protocol; a gap reads the same
        fig.add_trace(go.Scatter(x=values.index, y=values.to_numpy(), mode="lines", name=name, legendgroup=name,
                                 line=dict(**style_of(styles, name, i), width=width)), row=1, col=1)
    if with_diff:
        assert reference is not None
        ref = series[reference]

        def difference(values: pd.Series) -> pd.Series:
            base = ref.reindex(values.index)
            return (values - base) / base.abs() if relative else values - base

        for band, name in bands:
            low, high = difference(band[0]), difference(band[1])
            if magnitude:
                low, high = low * 0.0, np.maximum(low.abs(), high.abs())
            floor_band(fig, list(band[0].index), low, high, row=2, show=False, log=magnitude, name=name,
                       **_kind(name))
        equal = []
        for i, (name, values) in enumerate(series.items()):
            if name == reference:
                continue
            raw = difference(values)
            shown = values.notna() | ref.reindex(values.index).notna()  # steps either run has (not a NaN's)
            if magnitude and shown.any() and (raw[shown] == 0).all():  # a step where one is NaN is not equal
                equal.append(name)
            diff = raw.replace([float("inf"), float("-inf")], float("nan")).dropna()
            if magnitude:
                diff = diff.abs().where(diff != 0)  # bitwise equal: a gap (log 0)
            fig.add_trace(go.Scatter(x=diff.index, y=diff.to_numpy(), mode="lines", name=name, legendgroup=name,
                                     showlegend=False, line=dict(**style_of(styles, name, i), width=1.5)),
                          row=2, col=1)
        measure = f"relative to {reference}" if relative else f"minus {reference}"
        ticks = log_ticks(*(t.y for t in fig.data if t.yaxis == "y2" and t.y is not None)) if magnitude else {}
        fig.update_yaxes(title=f"|{measure}|" if magnitude else measure, type="log" if magnitude else "linear",
                         exponentformat="power", row=2, col=1, **ticks)
        if equal:  # said in the legend, where it covers no curve (a log axis has no place for a zero)
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", marker=dict(color="rgba(0,0,0,0)"),
                                     name=f"equal to {reference} at every step: {', '.join(equal)}",
                                     hoverinfo="skip", legendrank=2000), row=2, col=1)
    apply_style(fig, title=title or f"{quantity} of {len(series)} {'run' if len(series) == 1 else 'runs'}",
                provenance=provenance, height=600 if with_diff else 460)
    fig.update_yaxes(title=quantity, type="log" if log_y else "linear", row=1, col=1)
    fig.update_xaxes(title="step", row=2 if with_diff else 1, col=1)
    if anomalies is not None:
        mark_anomalies(fig, anomalies, row=1, col=1)
    # a legend entry per run, band and mark, and the height they take: each run is its own legend group, and
    # plotly's gap between groups made 13 runs' legend scroll, its last entries hidden
    fig.update_layout(legend=dict(tracegroupgap=0), height=max(fig.layout.height, legend_height(fig)))
    return fig


def _kind(band: str) -> dict[str, bool]:
    """``floor_band``'s colour switches for the band named ``band``."""
    return {"seeds": band == SEED_SPREAD, "rounding": band == ROUNDING_BAND}

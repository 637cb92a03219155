"""Anomalies (``workbench.analysis.anomalies.find_anomalies``) marked on a trajectory figure.

    fig = trajectory_figure(ws.scalar("loss"), reference="det-r0")
    mark_anomalies(fig, found.assign(run="tp2"))          # or trajectory_figure(..., anomalies=...)

Pure: a figure and an anomaly table in, the same figure with one marker trace per rule out
(a symbol per rule, the colour of the run's curve). A marker sits on its run's curve at its
step: the curve named by the table's ``run`` column, or the only curve of the panel when the
table has no such column. Where that curve has no finite value at the step (a NaN loss is a
gap in the line) or there is no such curve, the marker sits at the highest value drawn in the
panel. Hovering shows step, rule, site, value and threshold. The first NaN/Inf of each run is
also a dotted vertical line through every panel. NaN and Inf values appear only as text: the
widget protocol rejects NaN in the figure's JSON.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

SYMBOLS: dict[str, str] = {"nonfinite": "x", "loss_spike": "triangle-up", "grad_explode": "star",
                           "grad_vanish": "triangle-down", "update_ratio": "diamond"}
"""Marker symbol per rule; other rules are drawn as circles."""
NO_CURVE_COLOUR = "#000000"
"""Markers of anomalies whose run has no curve in the panel."""
NONFINITE_LINE = dict(color="#882255", dash="dot", width=1.5)
REQUIRED = ("step", "rule", "site", "value", "threshold")


def mark_anomalies(fig: go.Figure, anomalies: pd.DataFrame, *, row: int = 1, col: int = 1) -> go.Figure:
    """Mark the rows of ``anomalies`` on the panel (``row``, ``col``) of ``fig`` as the module
    docstring describes; returns ``fig``. An optional ``run`` column names each row's curve."""
    missing = [c for c in REQUIRED if c not in anomalies.columns]
    if missing:
        raise ValueError(f"the anomalies table lacks the columns {', '.join(missing)}; "
                         "pass a table made by workbench.analysis.anomalies.find_anomalies")
    if anomalies.empty:
        return fig
    xref, yref = _axis_refs(fig, row, col)
    curves = _curves(fig, xref, yref)
    top = _top(fig, xref, yref)
    runs = anomalies["run"].astype(str) if "run" in anomalies.columns else \
        pd.Series([next(iter(curves)) if len(curves) == 1 else ""] * len(anomalies), index=anomalies.index)
    for rule, group in anomalies.groupby("rule", sort=False):
        xs, ys, colours, texts = [], [], [], []
        for index, found in group.iterrows():
            run, step = runs.loc[index], int(found["step"])
            values, line_colour = curves.get(run, (None, NO_CURVE_COLOUR))
            y = values.get(step, np.nan) if values is not None else np.nan
            xs.append(step)
            ys.append(float(y) if np.isfinite(y) else top)
            colours.append(line_colour)
            texts.append(_hover(found, run))
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=f"anomaly: {rule}", legendgroup="anomalies",
                                 xaxis=xref, yaxis=yref, text=texts, hovertemplate="%{text}<extra></extra>",
                                 marker=dict(symbol=SYMBOLS.get(str(rule), "circle"), size=11, color=colours,
                                             line=dict(width=1, color="#ffffff"))))
    for index, found in anomalies[anomalies["rule"] == "nonfinite"].iterrows():
        step, run = int(found["step"]), runs.loc[index]
        fig.add_vline(x=step, line=NONFINITE_LINE)
        fig.add_annotation(x=step, xref=xref, y=1, yref=f"{yref} domain", showarrow=False, xanchor="left",
                           yanchor="top", text="first NaN/Inf" + (f" ({run})" if run else ""),
                           font=dict(size=11, color=NONFINITE_LINE["color"]), name="first-nonfinite")
    return fig


def _axis_refs(fig: go.Figure, row: int, col: int) -> tuple[str, str]:
    """The trace references (``x2``, ``y2`` ...) of one panel."""
    try:
        subplot = fig.get_subplot(row, col)
    except TypeError:  # plotly's answer for a figure not made by make_subplots: it has one panel
        return "x", "y"
    return subplot.xaxis.plotly_name.replace("axis", ""), subplot.yaxis.plotly_name.replace("axis", "")


def _panel_traces(fig: go.Figure, xref: str, yref: str) -> list[go.Scatter]:
    return [t for t in fig.data if t.type == "scatter" and t.y is not None
            and (t.xaxis or "x") == xref and (t.yaxis or "y") == yref]


def _curves(fig: go.Figure, xref: str, yref: str) -> dict[str, tuple[pd.Series, str]]:
    """Line traces of a panel by name: their finite values by step, and their colour."""
    curves = {}
    for trace in _panel_traces(fig, xref, yref):
        if trace.name and "lines" in (trace.mode or "") and trace.fill in (None, "none"):
            values = pd.Series(np.asarray(trace.y, dtype=float), index=np.asarray(trace.x))
            curves[str(trace.name)] = (values[np.isfinite(values)], trace.line.color or NO_CURVE_COLOUR)
    return curves


def _top(fig: go.Figure, xref: str, yref: str) -> float:
    """The highest finite value drawn in a panel (1.0 for an empty one)."""
    values = [np.asarray(t.y, dtype=float) for t in _panel_traces(fig, xref, yref)]
    finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.array([])
    return float(finite.max()) if finite.size else 1.0


def _hover(found: pd.Series, run: str) -> str:
    value, threshold = float(found["value"]), float(found["threshold"])
    lines = [f"{run}: step {int(found['step'])}" if run else f"step {int(found['step'])}",
             f"{found['rule']} at {found['site']}", f"value {value:.4g}, threshold {threshold:.4g}"]
    if "detail" in found.index and found["detail"]:
        lines.append(str(found["detail"]))
    return "<br>".join(lines)

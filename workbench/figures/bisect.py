"""Figures of replay and bisect: where in one step's operations two runs part, and how close a replay stays.

    fig = operation_figure(bisect.operation, title="det-r0 vs fault, step 33")
    fig = replay_figure(replay.check)

Pure: results of ``analysis.optrace.first_operation`` and ``analysis.replay.replay_check`` in,
figures out. The operation figure puts every aligned operation of the step on one row per
module scope, in execution order: grey where the outputs are equal, orange where an input
already differs (downstream), and the origin as a red star.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from workbench.analysis.optrace import OperationOrigin
from workbench.analysis.replay import ReplayCheck
from workbench.figures.style import PALETTE, Provenance, apply_style

_STATES = (  # (name, colour, size)
    ("outputs equal", "#bdbdbd", 4),
    ("not comparable (split over ranks)", "#e0e0e0", 4),
    ("input differs (downstream)", PALETTE[4], 5),
    ("outputs differ, inputs equal", PALETTE[1], 8),
)


def _state(inputs: str, outputs: str) -> int:
    if inputs == "differ":
        return 2
    if outputs == "differ":
        return 3 if inputs == "equal" else 1
    return 0 if outputs == "equal" else 1


def operation_figure(result: OperationOrigin, *, provenance: Provenance | None = None,
                     title: str = "operations of the bisected step") -> go.Figure:
    """Aligned operations (x: position in run A's order, y: module scope); the origin starred."""
    table = result.operations
    fig = go.Figure()
    if table.empty:
        return apply_style(fig, title=f"{title}: no aligned operations", provenance=provenance)
    scopes = list(dict.fromkeys(table["scope"].replace("", "(outside modules)")))
    label = table["scope"].replace("", "(outside modules)")
    states = np.array([_state(i, o) for i, o in zip(table["inputs"], table["outputs"])])
    hover = (table["phase"] + " " + table["op"] + "<br>" + label + ", micro-batch " + table["microbatch"].astype(str)
             + "<br>inputs " + table["inputs"] + ", outputs " + table["outputs"])
    for index, (name, colour, size) in enumerate(_STATES):
        chosen = states == index
        if chosen.any():
            fig.add_trace(go.Scattergl(x=table["position"][chosen], y=label[chosen], mode="markers", name=name,
                                       marker=dict(color=colour, size=size), text=hover[chosen],
                                       hovertemplate="%{text}<extra></extra>"))
    origin = result.origin
    if origin is not None:
        # An operation of one run only has no place in the aligned order: star where it took effect.
        at = origin if origin.run == "both" else result.first_affected
        match = table.iloc[0:0] if at is None else table[
            (table["phase"] == at.phase) & (table["scope"] == at.scope) & (table["op"] == at.op)
            & (table["microbatch"] == at.microbatch) & (table["occurrence"] == at.occurrence)]
        if not match.empty:
            row = match.iloc[0]
            scope = origin.scope if origin.scope in scopes else row["scope"] or "(outside modules)"
            fig.add_trace(go.Scatter(x=[row["position"]], y=[scope], mode="markers",
                                     name=f"origin: {origin.op} ({origin.source or 'no source line'})",
                                     marker=dict(symbol="star", size=18, color=PALETTE[1],
                                                 line=dict(color="#000000", width=1))))
    fig.update_yaxes(categoryorder="array", categoryarray=scopes[::-1], tickmode="array", tickvals=scopes,
                     tickfont=dict(size=10), title=None)
    fig.update_xaxes(title="operation (execution order of run A)")
    apply_style(fig, title=title, provenance=provenance, height=max(460, 15 * len(scopes) + 220), width=1100)
    fig.update_layout(legend=dict(orientation="h", x=0, y=1.0, yanchor="bottom", font=dict(size=11)),
                      margin=dict(t=110))
    return fig


def replay_figure(check: ReplayCheck, *, provenance: Provenance | None = None) -> go.Figure:
    """Per replayed step: relative difference of the loss and the largest of any site (0 drawn at 1e-18)."""
    fig = go.Figure()
    floor = 1e-18
    for i, (column, name) in enumerate((("loss_rel", "loss"), ("max_site_rel", "largest site (L2 norm)"))):
        values = check.closeness[column].to_numpy(dtype=float)
        shown = np.where(np.isfinite(values), np.maximum(values, floor), np.nan)
        keep = np.isfinite(shown)
        fig.add_trace(go.Scatter(x=check.closeness.index[keep], y=shown[keep], mode="lines+markers", name=name,
                                 line=dict(color=PALETTE[i])))
    verdict = "reproduced bitwise" if check.reproduced else f"departs at step {check.first_step}"
    fig.update_yaxes(type="log", dtick=1, title="relative difference (1e-18 = equal)", exponentformat="power")
    fig.update_xaxes(title="step")
    return apply_style(fig, title=f"replay {check.replay} vs {check.original}: {verdict}", provenance=provenance,
                       height=420)

"""Figures of replay and bisect: where in one step's operations two runs part, and how close a replay stays.

    fig = operation_figure(bisect.operation, title="det-r0 vs fault, step 33")
    fig = replay_figure(replay.check)

Pure: results of ``analysis.trace_alignment.first_operation`` and ``analysis.replay_check`` in,
figures out. The operation figure puts every aligned operation of the step on one row per
module scope, in execution order: grey where the outputs are equal, orange where an input
already differs (downstream), and the origin as a red star. Rows follow the model: scopes by
their first forward operation, and a scope with none (an identity norm or dropout, traced in
backward only) among its parent module's scopes where the backward pass, reversed, puts it. The
replay figure draws each step's relative difference on a log axis and the steps with no difference
as markers on a strip of their own below it: zero has no place on a log axis.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.analysis.replay_check import ReplayCheck
from workbench.analysis.trace_alignment import OperationOrigin
from workbench.figures.style import PALETTE, apply_style
from workbench.store.manifest import Provenance

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
    label = table["scope"].replace("", "(outside modules)")
    scopes = scopes_in_model_order(table.assign(scope=label))
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


def scopes_in_model_order(operations: pd.DataFrame) -> list[str]:
    """The scopes of ``operations`` (rows in execution order: ``phase``, ``scope``) in model order.

    Scopes are ordered by their first forward operation. A scope without one (an identity module
    whose only traced operations are in backward) joins the scopes of its nearest ancestor that has
    some, where the backward pass, reversed, puts it among them (after them when it cannot say);
    scopes of other phases only (the optimizer's) come last, in execution order."""
    scopes = operations["scope"]
    order = list(dict.fromkeys(scopes[operations["phase"] == "forward"]))
    backward = list(dict.fromkeys(scopes[operations["phase"] == "backward"]))
    # a module's gradient is computed after those of the modules that ran after it in forward
    forward_rank = {scope: -i for i, scope in enumerate(backward)}
    late = []
    for scope in dict.fromkeys(scopes):
        if scope in order:
            continue
        if scope not in forward_rank:
            late.append(scope)
            continue
        family = _family(scope, order)
        ranked = [i for i in family if order[i] in forward_rank]
        earlier = [i for i in ranked if forward_rank[order[i]] < forward_rank[scope]]
        later = [i for i in ranked if forward_rank[order[i]] > forward_rank[scope]]
        order.insert(max(earlier) + 1 if earlier else min(later) if later else max(family, default=-1) + 1, scope)
    return order + late


def _family(scope: str, order: list[str]) -> list[int]:
    """Indices in ``order`` of the scopes under ``scope``'s nearest ancestor that has any there."""
    parts = scope.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:depth])
        inside = [i for i, other in enumerate(order) if other == prefix or other.startswith(prefix + ".")]
        if inside:
            return inside
    return list(range(len(order)))


def replay_figure(check: ReplayCheck, *, provenance: Provenance | None = None) -> go.Figure:
    """Per replayed step: relative difference of the loss and the largest of any site's L2 norm on a log axis;
    steps where it is zero (equal) as markers on a strip below; NaN (not compared) left out of both."""
    series = (("loss_rel", "loss"), ("max_site_rel", "largest site (L2 norm)"))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.8, 0.2], vertical_spacing=0.05)
    steps = check.closeness.index.to_numpy()
    differs_anywhere = equal_anywhere = False
    for i, (column, name) in enumerate(series):
        values = check.closeness[column].to_numpy(dtype=float)
        differs, equal = np.isfinite(values) & (values > 0), values == 0
        differs_anywhere |= bool(differs.any())
        equal_anywhere |= bool(equal.any())
        fig.add_trace(go.Scatter(x=steps[differs], y=values[differs], mode="lines+markers", name=name,
                                 legendgroup=name, line=dict(color=PALETTE[i]),
                                 hovertemplate=f"step %{{x}}<br>{name}: relative difference %{{y:.2e}}<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=steps[equal], y=[name] * int(equal.sum()), mode="markers", name=f"{name}: equal",
                                 legendgroup=name, showlegend=False,
                                 marker=dict(color=PALETTE[i], size=9, symbol="circle-open", line=dict(width=2)),
                                 hovertemplate=f"step %{{x}}<br>{name}: equal (difference 0)<extra></extra>"),
                      row=2, col=1)
    if not differs_anywhere:
        fig.add_annotation(text="no replayed step differs" if equal_anywhere else "no step compared",
                           xref="x domain", yref="y domain", x=0.5, y=0.5, showarrow=False,
                           font=dict(color="#666666"), name="no-difference")
    verdict = "reproduced bitwise" if check.reproduced else f"departs at step {check.first_step}"
    fig.update_yaxes(type="log", dtick=1, title="relative difference", exponentformat="power",
                     showticklabels=differs_anywhere, row=1, col=1)
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=[name for _, name in series][::-1],
                     range=[-0.6, len(series) - 0.4], showgrid=False, title="equal", tickfont=dict(size=10),
                     row=2, col=1)
    fig.update_xaxes(title="step", dtick=1 if len(steps) <= 20 else None, row=2, col=1)
    return apply_style(fig, title=f"replay {check.replay} vs {check.original}: {verdict}", provenance=provenance,
                       height=460)

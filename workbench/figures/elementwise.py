"""Element-wise differences of two runs' snapshots at one step: the ULP-distance histogram per site
and the largest absolute difference per site.

    elementwise_figure({"grad:...": elementwise_difference(a, b)}, step=30, a="det-r0", b="nondet-r0")

Pure: ``analysis.elementwise.ElementwiseDifference`` results in, a plotly figure out.
"""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.analysis.elementwise import ElementwiseDifference
from workbench.figures.style import apply_style, colour, fit_footer, legend_rows, log_ticks
from workbench.store.manifest import Provenance


def elementwise_figure(differences: Mapping[str, ElementwiseDifference], *, step: int, a: str, b: str,
                       provenance: Provenance | None = None) -> go.Figure:
    """Top: ULP-distance histogram per site. Below: largest absolute difference per site, in the same colours and
    in the legend's order (the legend, above the plot, names the sites of both panels; up to 20)."""
    sites = list(differences)
    named = len(sites) <= 20
    share = min(0.5, 0.12 + 0.05 * len(sites))  # the lower panel's part of the height: a band per site
    fig = make_subplots(rows=2, cols=1, row_heights=[1 - share, share], vertical_spacing=0.22)
    for i, (site, diff) in enumerate(differences.items()):
        hist = diff.ulp_histogram
        fig.add_trace(go.Bar(x=list(hist.index), y=hist.to_numpy(), name=site, legendgroup=site, showlegend=named,
                             marker_color=colour(i), hovertemplate=f"{site}<br>%{{y}} elements %{{x}} ULPs apart"
                             "<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Bar(x=[diff.max_abs], y=[site], orientation="h", name=site, legendgroup=site,
                             showlegend=False, marker_color=colour(i), offsetgroup="largest",  # one slot a row
                             hovertemplate="%{y}<br>max abs difference %{x:.3g}<extra></extra>"), row=2, col=1)
    title = f"{a} vs {b} at step {step}: element-wise differences of {len(sites)} snapshots"
    apply_style(fig, title=title, provenance=provenance, height=max(460, 360 + 26 * len(sites)))
    rows = legend_rows(sites) if named else 0
    # the title pinned to the top of the figure, the legend under it: plotly centres a title in the top margin,
    # and a margin grown for the legend's rows brought the title down onto the legend's first entry (the report)
    fig.update_layout(barmode="group", margin=dict(t=_TITLE_BAND + _LEGEND_ROW * rows),
                      title=dict(yref="container", y=1.0, yanchor="top", pad=dict(t=14)),
                      legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom",
                                  traceorder="normal"))
    fig.update_yaxes(type="log", title="elements", exponentformat="power", row=1, col=1,
                     **log_ticks(*(d.ulp_histogram.to_numpy() for d in differences.values())))
    bins = list(dict.fromkeys(label for d in differences.values() for label in d.ulp_histogram.index))
    every = -(-len(bins) // 14)  # at most ~14 labels: upright, none over another
    fig.update_xaxes(title="ULP distance in the training dtype",
                     type="category", tickangle=0, tickmode="array", tickvals=bins[::every],
                     ticktext=[_power_of_two(label) for label in bins[::every]], row=1, col=1)
    equal = any(differences[s].max_abs == 0 for s in sites)  # a log axis has no bar for them
    fig.update_xaxes(type="log", title="largest |a - b|" + (" (no bar: equal)" if equal else ""),
                     exponentformat="e", tickangle=0, nticks=4, row=2, col=1)
    fig.update_yaxes(showticklabels=False, autorange="reversed", row=2, col=1)
    return fit_footer(fig)


_TITLE_BAND = 60
"""Pixels above the legend for the title."""
_LEGEND_ROW = 22
"""Pixels per row of the legend."""


def _power_of_two(label: str) -> str:
    """A ULP bin's label ("0", "1", "4-7") as its lower edge, a power of two written as one ("2<sup>2</sup>")."""
    low = int(label.split("-")[0])
    return label if low < 2 else f"2<sup>{low.bit_length() - 1}</sup>"

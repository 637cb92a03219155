"""What deterministic mode costs as a figure: the median rate per configuration, both sides, and the tax
in % with its bootstrap interval.

    cost_figure(determinism_cost(samples))      # analysis.cost's table

Pure: a table in, a plotly figure out.
"""

from __future__ import annotations

import textwrap

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.figures.style import PALETTE, apply_style
from workbench.store.manifest import Provenance

_LABEL_CHARS = 14
"""Characters a line of a configuration's tick label holds: two of them side by side in a panel of a 700 px figure."""
_LINE_PX = 16
"""Pixels a line more of a tick label takes."""


def cost_figure(cost: pd.DataFrame, *, provenance: Provenance | None = None, rate: str = "tokens per second",
                interval: float = 95.0, sides: tuple[str, str] = ("deterministic", "default"),
                title: str = "what deterministic mode costs, per configuration") -> go.Figure:
    """Left: the median rate (tokens/s, or steps/s) per configuration (``analysis.cost``'s table), the two
    ``sides`` (deterministic vs default; for ``analysis.sources.source_cost``: every source off vs the source
    on). Right: the tax in % with its bootstrap interval."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.14,
                        subplot_titles=(f"{rate} (median)", f"determinism tax ({interval:g}% interval)"))
    configs = cost["config"].tolist()
    for column, label, i in (("deterministic_tokens_per_s", sides[0], 0), ("default_tokens_per_s", sides[1], 1)):
        fig.add_trace(go.Bar(x=configs, y=cost[column], name=label, marker_color=PALETTE[i]), row=1, col=1)
    fig.add_trace(go.Scatter(x=configs, y=cost["tax_percent"], mode="markers", showlegend=False,
                             marker=dict(size=11, color=PALETTE[2]),
                             error_y=dict(type="data", symmetric=False, array=cost["ci_high"] - cost["tax_percent"],
                                          arrayminus=cost["tax_percent"] - cost["ci_low"]),
                             hovertemplate="%{x}<br>tax %{y:.1f} %<extra></extra>"), row=1, col=2)
    fig.add_hline(y=0, line=dict(color="#999999", width=1), row=1, col=2)
    # a configuration's name on lines of its own words, upright: slanted, plotly's labels ran over each other and
    # over the provenance footer (the report's print size)
    labels = ["<br>".join(textwrap.wrap(str(c), _LABEL_CHARS)) or str(c) for c in configs]
    lines = max((label.count("<br>") + 1 for label in labels), default=1)
    apply_style(fig, title=title, provenance=provenance, height=480 + _LINE_PX * (lines - 1),
                room_below=_LINE_PX * (lines - 1))
    fig.update_xaxes(tickmode="array", tickvals=configs, ticktext=labels, tickangle=0)
    fig.update_layout(barmode="group")
    fig.update_yaxes(title=rate, col=1)
    fig.update_yaxes(title="tax %", col=2)
    return fig

"""Which nondeterminism source matters, as a figure: each source alone against the reference, its
final relative difference and what making it deterministic costs.

    sources_figure(workspace.attribution(), on_cpu=workspace.on_cpu)   # analysis.sources' table

Pure: a table in, a plotly figure out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.figures.style import PALETTE, apply_style, colour, fit_footer
from workbench.store.manifest import Provenance


def sources_figure(table: pd.DataFrame, *, provenance: Provenance | None = None, on_cpu: bool = False,
                   interval: float = 95.0) -> go.Figure:
    """One row per nondeterminism source (``analysis.sources.attribution``), labelled with its first divergent
    step and site. Left: its run's final relative difference from the reference (median over sites, log
    scale) of the statistic ``table.attrs["stat"]`` names (l2 if it names none). Right: what making that source
    deterministic costs in tokens/s, with its bootstrap interval (on a CPU: the cost of the workbench's
    emulation of it, said under the title)."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.05, shared_yaxes=True,
                        subplot_titles=("final relative difference", f"cost, % ({interval:g}% interval)"))
    rows = [f"<b>{source}</b><br>" + ("identical" if pd.isna(step) else f"step {int(step)}, {site}")
            for source, step, site in zip(table["source"], table["first_step"], table["first_site"], strict=True)]
    final = table["final_error"].to_numpy(dtype=float)
    fig.add_trace(go.Scatter(x=np.where(final > 0, final, np.nan), y=rows, mode="markers", showlegend=False,
                             marker=dict(size=12, color=[colour(i) for i in range(len(rows))]),
                             hovertemplate="%{y}<br>final relative difference %{x:.2e}<extra></extra>"), row=1, col=1)
    cost = table["cost_percent"].to_numpy(dtype=float)
    fig.add_trace(go.Scatter(x=cost, y=rows, mode="markers", showlegend=False, marker=dict(size=11, color=PALETTE[2]),
                             error_x=dict(type="data", symmetric=False,
                                          array=table["cost_high"].to_numpy(dtype=float) - cost,
                                          arrayminus=cost - table["cost_low"].to_numpy(dtype=float)),
                             hovertemplate="%{y}<br>cost %{x:.1f} %<extra></extra>"), row=1, col=2)
    fig.add_vline(x=0, line=dict(color="#999999", width=1), row=1, col=2)
    title = "which source of nondeterminism matters: each one alone against the reference"
    if on_cpu:
        title += ("<br><sup>on this CPU each source is the workbench's emulation of it, and its cost the "
                  "emulation's (negative: the emulation is slower)</sup>")
    apply_style(fig, title=title, provenance=provenance, height=max(340, 140 + 80 * len(rows)))  # as wide as its place
    fig.update_layout(margin=dict(l=330, t=100))
    fit_footer(fig)
    finite = final[np.isfinite(final) & (final > 0)]
    decades = ([float(np.floor(np.log10(finite.min()))), float(np.ceil(np.log10(finite.max())))]
               if finite.size else [-8.0, 0.0])
    decades[1] = max(decades[1], decades[0] + 1)  # whole decades, one tick each: labels that do not collide
    stat = table.attrs.get("stat", "l2")  # the statistic the differences are of (``studies.measures.attribution``)
    fig.update_xaxes(type="log", range=decades, dtick=1, exponentformat="power",
                     title=f"relative difference of {stat}, last step", col=1)
    fig.update_xaxes(title="tokens/s lost making it deterministic, %", col=2)
    fig.update_yaxes(autorange="reversed", col=1)
    return fig

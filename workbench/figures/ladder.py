"""The ladder as a figure: each run's relative difference from the reference per layer at the
last step (left) and over steps (right), the noise floor's and the seed-to-seed bands behind them, and a
marker where each run leaves the floor.

    ladder_figure(ladder(ref, others), noise=ladder(ref, repeats), seeds=ladder(ref, seed_runs))

Pure: an ``analysis.ladder.Ladder`` in, a plotly figure out.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.analysis.ladder import Ladder
from workbench.figures.style import (
    NOISE_FLOOR,
    ROUNDING_BAND,
    SEED_SPREAD,
    RunStyles,
    apply_style,
    floor_band,
    legend_rows,
    log_ticks,
    short_layer,
    style_of,
)
from workbench.sites import layer_order
from workbench.store.manifest import Provenance


def ladder_figure(ladder: Ladder, *, noise: Ladder | None = None, seeds: Ladder | None = None,
                  rounding: Ladder | None = None, verdicts: Mapping[str, str] | None = None,
                  provenance: Provenance | None = None, styles: RunStyles | None = None) -> go.Figure:
    """Left: relative error per layer at the last step, one line per run. Right: relative error over steps
    (median over layers), on the same y axis. The noise floor (repeats against the same reference) and the
    seed-to-seed spread (other seeds against one run) are bands, and so is the rounding band (the reference's
    band runs against it: what a correct change may do). Where a run leaves the noise floor is a triangle on its
    line in both panels (the layer on the left, the step on the right), and its legend entry says both, and its
    verdict, bug or rounding, where ``verdicts`` has one (run -> a few words): nothing is written over the lines.

    The legend lies above the plot, in the top margin (in a paper's sizes too: no subplot titles there); the
    layer names are short ("emb", "L0", "ln_f", "out") and upright, at most eight of them (every n-th of a deep
    model), so that they read at a paper column's width. ``styles``: each run's line style (``style.run_styles``
    of a folder's runs: a run keeps its colour whichever runs are drawn); else by order."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.64, 0.36], horizontal_spacing=0.03, shared_yaxes=True)
    final = ladder.final_by_layer()
    layers = layer_order([str(c) for c in final.columns])
    for band, name in ((seeds, SEED_SPREAD), (noise, NOISE_FLOOR), (rounding, ROUNDING_BAND)):
        if band is None or band.per_layer.empty:
            continue
        kind = dict(seeds=name == SEED_SPREAD, rounding=name == ROUNDING_BAND)
        band_final = band.final_by_layer().reindex(columns=layers)
        floor_band(fig, layers, band_final.min(), band_final.max(), col=1, name=name, log=True, **kind)
        over_steps = band.per_layer.groupby(["run", "step"])["relative_error"].median().unstack("run")
        floor_band(fig, list(over_steps.index), over_steps.min(axis=1), over_steps.max(axis=1), col=2, name=name,
                   show=False, log=True, **kind)
    exits = ladder.summary.dropna(subset=["floor_exit_layer"]).set_index("run")
    for i, run in enumerate(final.index):
        style = style_of(styles, str(run), i)  # a folder's order: the run's colour in every figure
        values = pd.Series(final.loc[run, layers].to_numpy(dtype=float), index=layers)
        values = values.where(values > 0)  # a log axis: no difference is a gap
        steps = ladder.per_layer[ladder.per_layer["run"] == run].groupby("step")["relative_error"].median()
        steps = steps.where(steps > 0)
        exit_, legend = (exits.loc[run] if run in exits.index else None), str(run)
        if exit_ is not None:
            layer, step, site = str(exit_["floor_exit_layer"]), int(exit_["floor_exit_step"]), exit_["floor_exit_site"]
            legend = f"{run} {_EXIT} {short_layer(layer)}, step {step}"
        if verdicts is not None and run in verdicts:
            legend += f" · {verdicts[run]}"
        # the left line keeps the run's name; the right one carries the legend entry, with where it leaves the floor
        fig.add_trace(go.Scatter(x=layers, y=values.to_numpy(), mode="lines+markers", name=str(run),
                                 legendgroup=str(run), showlegend=False, line=style), row=1, col=1)
        fig.add_trace(go.Scatter(x=steps.index, y=steps.to_numpy(), mode="lines", name=legend, legendgroup=str(run),
                                 line=style), row=1, col=2)
        if exit_ is not None:  # drawn after the lines: on top of them
            hover = f"{run} leaves the noise floor at step {step} in {layer} ({site})<extra></extra>"
            for col, x, y in ((1, layer, values.get(layer)), (2, step, steps.get(step))):
                fig.add_trace(go.Scatter(x=[x], y=[y], mode="markers", name=f"{run} leaves the noise floor",
                                         legendgroup=str(run), showlegend=False, hovertemplate=hover,
                                         marker=dict(symbol="triangle-up", size=13, color=style["color"],
                                                     line=dict(color="#222222", width=1))), row=1, col=col)
    apply_style(fig, title=f"relative difference of {ladder.stat} against {ladder.reference}",
                provenance=provenance, height=520, room_below=_SECOND_TITLE_LINE)
    entries = [str(t.name) for t in fig.data if t.showlegend is not False]
    title = f"{_EXIT} leaves the noise floor: layer, step" if len(exits) else None
    fig.update_layout(title=dict(yref="container", y=1.0, yanchor="top", pad=dict(t=14)),
                      legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom", tracegroupgap=0,
                                  title=dict(text=title, side="top")),
                      margin=dict(t=_TITLE_BAND + _LEGEND_ROW * (legend_rows(entries) + (title is not None))))
    shown = layers[::max(1, -(-len(layers) // _MOST_LAYER_TICKS))]
    fig.update_xaxes(title="layer<br>(at the last step)", type="category", categoryorder="array", categoryarray=layers,
                     tickmode="array", tickvals=shown, ticktext=[short_layer(lb) for lb in shown], tickangle=0,
                     col=1)
    fig.update_xaxes(title="step<br>(median of layers)", tickangle=0, col=2)
    # both panels share their values' span (bands and runs): a decade a label where that is two decades or more
    ticks = log_ticks(*(t.y for t in fig.data if t.y is not None and t.type == "scatter"))
    fig.update_yaxes(type="log", exponentformat="power", title="relative difference", col=1, **ticks)
    fig.update_yaxes(type="log", exponentformat="power", col=2, **ticks)
    return fig


_EXIT = "▲"
_MOST_LAYER_TICKS = 8
"""Layer names under the left panel: at a paper column's width (~150 px, 9 px type) eight short ones fit upright."""
_TITLE_BAND = 44
"""Pixels above the legend for the title (13 px type and its padding)."""
_LEGEND_ROW = 22
"""Pixels a row of the legend (or its title) takes: 13 px type, no gap between groups (tracegroupgap=0)."""
_SECOND_TITLE_LINE = 20
"""Pixels under the plot for the x axis titles' second line (13 px type)."""



"""Study figures: the precision ladder / layout comparison, element-wise snapshot differences, the
throughput cost of deterministic mode and the attribution of nondeterminism to its sources.

    ladder_figure(ladder(ref, others), noise=ladder(ref, repeats))
    elementwise_figure({"grad:...": elementwise_difference(a, b)}, step=30)
    cost_figure(determinism_cost(samples))
    sources_figure(workspace.attribution(), on_cpu=workspace.on_cpu)

Pure: analysis results in, plotly figures out.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.analysis.elementwise import ElementwiseDifference
from workbench.analysis.ladder import Ladder
from workbench.figures.style import (
    FONT_SIZE,
    NOISE_FLOOR,
    PALETTE,
    SEED_SPREAD,
    apply_style,
    colour,
    floor_band,
)
from workbench.sites import layer_order
from workbench.store.manifest import Provenance


def ladder_figure(ladder: Ladder, *, noise: Ladder | None = None, seeds: Ladder | None = None,
                  provenance: Provenance | None = None) -> go.Figure:
    """Left: relative error per layer at the last step, one line per run. Right: relative error over steps
    (median over layers), on the same y axis. The noise floor (repeats against the same reference) and the
    seed-to-seed spread (other seeds against one run) are bands. Where a run leaves the noise floor is a
    triangle on its line in both panels (the layer on the left, the step on the right), and its legend entry
    says both: nothing is written over the lines.

    The legend lies above the plot, in the top margin (in a paper's sizes too: no subplot titles there); the
    layer names are short ("emb", "L0", "ln_f", "out") and upright, at most eight of them (every n-th of a deep
    model), so that they read at a paper column's width."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.64, 0.36], horizontal_spacing=0.03, shared_yaxes=True)
    final = ladder.final_by_layer()
    layers = layer_order([str(c) for c in final.columns])
    for band, is_seeds in ((seeds, True), (noise, False)):
        if band is None or band.per_layer.empty:
            continue
        name = SEED_SPREAD if is_seeds else NOISE_FLOOR
        band_final = band.final_by_layer().reindex(columns=layers)
        floor_band(fig, layers, band_final.min(), band_final.max(), col=1, name=name, log=True, seeds=is_seeds)
        over_steps = band.per_layer.groupby(["run", "step"])["relative_error"].median().unstack("run")
        floor_band(fig, list(over_steps.index), over_steps.min(axis=1), over_steps.max(axis=1), col=2, name=name,
                   show=False, log=True, seeds=is_seeds)
    exits = ladder.summary.dropna(subset=["floor_exit_layer"]).set_index("run")
    for i, run in enumerate(final.index):
        values = pd.Series(final.loc[run, layers].to_numpy(dtype=float), index=layers)
        values = values.where(values > 0)  # a log axis: no difference is a gap
        steps = ladder.per_layer[ladder.per_layer["run"] == run].groupby("step")["relative_error"].median()
        steps = steps.where(steps > 0)
        exit_, legend = (exits.loc[run] if run in exits.index else None), str(run)
        if exit_ is not None:
            layer, step, site = str(exit_["floor_exit_layer"]), int(exit_["floor_exit_step"]), exit_["floor_exit_site"]
            legend = f"{run} {_EXIT} {_short_layer(layer)}, step {step}"
        # the left line keeps the run's name; the right one carries the legend entry, with where it leaves the floor
        fig.add_trace(go.Scatter(x=layers, y=values.to_numpy(), mode="lines+markers", name=str(run),
                                 legendgroup=str(run), showlegend=False, line=dict(color=colour(i))), row=1, col=1)
        fig.add_trace(go.Scatter(x=steps.index, y=steps.to_numpy(), mode="lines", name=legend, legendgroup=str(run),
                                 line=dict(color=colour(i))), row=1, col=2)
        if exit_ is not None:  # drawn after the lines: on top of them
            hover = f"{run} leaves the noise floor at step {step} in {layer} ({site})<extra></extra>"
            for col, x, y in ((1, layer, values.get(layer)), (2, step, steps.get(step))):
                fig.add_trace(go.Scatter(x=[x], y=[y], mode="markers", name=f"{run} leaves the noise floor",
                                         legendgroup=str(run), showlegend=False, hovertemplate=hover,
                                         marker=dict(symbol="triangle-up", size=13, color=colour(i),
                                                     line=dict(color="#222222", width=1))), row=1, col=col)
    apply_style(fig, title=f"relative difference of {ladder.stat} against {ladder.reference}",
                provenance=provenance, height=520, room_below=_SECOND_TITLE_LINE)
    entries = [str(t.name) for t in fig.data if t.showlegend is not False]
    title = f"{_EXIT} leaves the noise floor: layer, step" if len(exits) else None
    fig.update_layout(title=dict(yref="container", y=1.0, yanchor="top", pad=dict(t=14)),
                      legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom", tracegroupgap=0,
                                  title=dict(text=title, side="top")),
                      margin=dict(t=_TITLE_BAND + _LEGEND_ROW * (_legend_rows(entries) + (title is not None))))
    shown = layers[::max(1, -(-len(layers) // _MOST_LAYER_TICKS))]
    fig.update_xaxes(title="layer<br>(at the last step)", type="category", categoryorder="array", categoryarray=layers,
                     tickmode="array", tickvals=shown, ticktext=[_short_layer(lb) for lb in shown], tickangle=0,
                     col=1)
    fig.update_xaxes(title="step<br>(median of layers)", tickangle=0, col=2)
    fig.update_yaxes(type="log", exponentformat="power", title="relative difference", col=1)
    fig.update_yaxes(type="log", exponentformat="power", col=2)
    return fig


_EXIT = "▲"
_MOST_LAYER_TICKS = 8
"""Layer names under the left panel: at a paper column's width (~150 px, 9 px type) eight short ones fit upright."""
_SHORT_LAYERS = {"embedding": "emb", "final_layernorm": "ln_f", "output_layer": "out"}
_TITLE_BAND = 44
"""Pixels above the legend for the title (13 px type and its padding)."""
_LEGEND_ROW = 22
"""Pixels a row of the legend (or its title) takes: 13 px type, no gap between groups (tracegroupgap=0)."""
_SECOND_TITLE_LINE = 20
"""Pixels under the plot for the x axis titles' second line (13 px type)."""


def _short_layer(label: str) -> str:
    """A layer's label as the ladder's axis writes it: ``emb``, ``L0`` ..., ``ln_f``, ``out``, ``loss``."""
    return _SHORT_LAYERS.get(label, label)


def _legend_rows(entries: list[str], width: float = 630.0) -> int:
    """Rows of a horizontal legend of ``entries`` across ``width`` pixels (a 700 px figure less its left margin),
    each entry its symbol (~40 px) and its text (~0.62 em a character)."""
    rows, used = 1, 0.0
    for entry in entries:
        needed = 40 + 0.62 * FONT_SIZE * len(entry)
        if used and used + needed > width:
            rows, used = rows + 1, 0.0
        used += needed
    return rows


def elementwise_figure(differences: Mapping[str, ElementwiseDifference], *, step: int, a: str, b: str,
                       provenance: Provenance | None = None) -> go.Figure:
    """Top: ULP-distance histogram per site. Below: largest absolute difference per site, the sites named
    beside their bars in the colours of the histogram (no legend; stacked, so long names never run into the
    histogram)."""
    sites = list(differences)
    share = min(0.5, 0.12 + 0.05 * len(sites))  # the lower panel's part of the height: a band per site
    fig = make_subplots(rows=2, cols=1, row_heights=[1 - share, share], vertical_spacing=0.22)
    for i, (site, diff) in enumerate(differences.items()):
        hist = diff.ulp_histogram
        fig.add_trace(go.Bar(x=list(hist.index), y=hist.to_numpy(), name=site, legendgroup=site, showlegend=False,
                             marker_color=colour(i), hovertemplate=f"{site}<br>%{{y}} elements %{{x}} ULPs apart"
                             "<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=[differences[s].max_abs for s in sites], y=sites, orientation="h", showlegend=False,
                         marker_color=[colour(i) for i in range(len(sites))],
                         hovertemplate="%{y}<br>max abs difference %{x:.3g}<extra></extra>"), row=2, col=1)
    apply_style(fig, title=f"{a} vs {b} at step {step}: element-wise differences of {len(sites)} snapshots",
                provenance=provenance, height=max(460, 360 + 26 * len(sites)))
    # the names' width set here rather than by automargin: the footer, at the plot's left edge, is wrapped by it
    names = max((len(s) for s in sites), default=0) if len(sites) <= 20 else 0
    fig.update_layout(barmode="group", margin=dict(l=max(70, round(7.2 * names) + 20)))
    fig.update_yaxes(type="log", title="elements", exponentformat="power", row=1, col=1)
    bins = list(dict.fromkeys(label for d in differences.values() for label in d.ulp_histogram.index))
    every = -(-len(bins) // 14)  # at most ~14 labels: upright, none over another
    fig.update_xaxes(title="ULP distance in the training dtype",
                     type="category", tickangle=0, tickmode="array", tickvals=bins[::every],
                     ticktext=[_power_of_two(label) for label in bins[::every]], row=1, col=1)
    equal = any(differences[s].max_abs == 0 for s in sites)  # a log axis has no bar for them
    fig.update_xaxes(type="log", title="largest |a - b|" + (" (no bar: equal)" if equal else ""),
                     exponentformat="e", tickangle=0, nticks=4, row=2, col=1)
    fig.update_yaxes(showticklabels=len(sites) <= 20, autorange="reversed", tickfont=dict(size=12), row=2, col=1)
    return fig


def _power_of_two(label: str) -> str:
    """A ULP bin's label ("0", "1", "4-7") as its lower edge, a power of two written as one ("2<sup>2</sup>")."""
    low = int(label.split("-")[0])
    return label if low < 2 else f"2<sup>{low.bit_length() - 1}</sup>"


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
    apply_style(fig, title=title, provenance=provenance, height=480)
    fig.update_layout(barmode="group")
    fig.update_yaxes(title=rate, col=1)
    fig.update_yaxes(title="tax %", col=2)
    return fig


def sources_figure(table: pd.DataFrame, *, provenance: Provenance | None = None, on_cpu: bool = False,
                   interval: float = 95.0) -> go.Figure:
    """One row per nondeterminism source (``analysis.sources.attribution``), labelled with its first divergent
    step and site. Left: its run's final relative difference from the reference (median over sites, log
    scale). Right: what making that source deterministic costs in tokens/s, with its bootstrap interval (on a
    CPU: the cost of the workbench's emulation of it, said under the title)."""
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
    apply_style(fig, title=title, provenance=provenance, height=max(340, 140 + 80 * len(rows)), width=1000)
    fig.update_layout(margin=dict(l=330, t=100))
    finite = final[np.isfinite(final) & (final > 0)]
    decades = ([float(np.floor(np.log10(finite.min()))), float(np.ceil(np.log10(finite.max())))]
               if finite.size else [-8.0, 0.0])
    decades[1] = max(decades[1], decades[0] + 1)  # whole decades, one tick each: labels that do not collide
    fig.update_xaxes(type="log", range=decades, dtick=1, exponentformat="power",
                     title="relative L2 difference, last step", col=1)
    fig.update_xaxes(title="tokens/s lost making it deterministic, %", col=2)
    fig.update_yaxes(autorange="reversed", col=1)
    return fig

"""Where and how two runs diverge: the divergence heatmap and the amplification plot.

    fig = divergence_heatmap(compare(a, b), stat="l2")
    fig = amplification_figure(compare(a, b))

Pure: a ``Comparison`` in, a plotly figure out. The heatmap shows sites (rows, in model
order: grouped by layer, then kind) against steps (columns): grey where the runs are
bitwise equal, else log10 of the relative difference of one statistic (no NaN gaps: the
matrix stays a float array that serialises as valid JSON and copies cheaply). Large runs are
binned (the largest difference in a bin is shown, so a single divergent cell is never
averaged away); the first divergent step and site are marked and the frontier (the
first divergent step of every site) is drawn over it. The title and the legend (which names the
first divergent step and site) lie in bands of the top margin, so nothing covers the matrix and
nothing overlaps, at screen size or at a paper's (``for_paper``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import xarray as xr

from workbench.analysis.compare import Comparison
from workbench.analysis.difference import relative as relative_of
from workbench.analysis.growth import amplification
from workbench.analysis.ladder import per_layer_error, sites_in_model_order
from workbench.figures.style import EQUAL_COLOUR, FONT_SIZE, SEQUENTIAL, apply_style, legend_rows, line_style
from workbench.sites import layer_label
from workbench.store.manifest import Provenance

DIFFERS_ONLY_IN_BITS = -17.0
"""Shown for cells whose fingerprints differ but whose statistic is equal (e.g. a permutation)."""
BITWISE_EQUAL = -18.0
"""Shown for bitwise-equal cells: below every difference, so binning by maximum keeps differences."""
_LOW = BITWISE_EQUAL
_BLOCK_CELLS = 1 << 16
"""Cells per block of ``heatmap_matrix``."""


def _colorscale() -> list[list[object]]:
    """Grey for bitwise equal, then cividis from "differs in bits only" (-17) to relative difference 1 (0)."""
    import plotly.colors

    cividis = plotly.colors.get_colorscale(SEQUENTIAL)
    step = 1.0 / -_LOW  # one unit of z in colour-scale coordinates
    scale: list[list[object]] = [[0.0, EQUAL_COLOUR], [step * 0.999, EQUAL_COLOUR]]
    scale += [[step + (1 - step) * float(pos), col] for pos, col in cividis]
    return scale


def _bins(count: int, limit: int) -> int:
    """Width of the bins when ``count`` items are grouped into at most ``limit`` bins of one width (the last
    one may be narrower)."""
    return max(1, -(-count // max(limit, 1)))


def _binned_max(values: np.ndarray, axis: int, width: int) -> np.ndarray:
    """Maximum over consecutive bins of ``width`` items along ``axis`` (the last bin may be narrower): a
    reshape and one reduction, which runs ~6x faster than ``np.maximum.reduceat`` over 10M cells."""
    if width == 1 or values.shape[axis] == 0:
        return values
    moved = np.moveaxis(values, axis, 0)
    whole = moved.shape[0] // width * width
    parts = [moved[:whole].reshape(whole // width, width, *moved.shape[1:]).max(axis=1)]
    if whole < moved.shape[0]:
        parts.append(moved[whole:].max(axis=0, keepdims=True))
    return np.moveaxis(np.concatenate(parts), 0, axis)


def heatmap_matrix(result: Comparison, stat: str = "l2", *, sites: list[str] | None = None,
                   steps: tuple[int, int] | None = None, relative: xr.DataArray | None = None,
                   values: tuple[xr.DataArray, xr.DataArray] | None = None) -> pd.DataFrame:
    """site x step: ``BITWISE_EQUAL`` where bitwise equal, else log10 relative difference
    (``DIFFERS_ONLY_IN_BITS`` where the statistic cannot see the difference); sites in model order.
    ``relative`` (step, site) replaces ``result.relative_difference`` of ``stat`` when already computed;
    ``values``, the two runs' own (step, site) values of ``stat``, replace it too: the relative difference is
    then computed block by block into the matrix (``difference.relative``), never whole, and nothing of it is
    kept (10k steps x 1k sites: a third of the time of computing it whole first, and 80 MB less held)."""
    order = sites_in_model_order(sites if sites is not None else result.common_sites)
    equal = result.equal
    if steps is not None:
        equal = equal.loc[steps[0]:steps[1]]
    is_equal, equal_columns = equal.to_numpy(), equal.columns.get_indexer(order)
    if values is not None:
        sources = [_Gather(v.transpose("step", "site"), equal.index, order) for v in values]
        missing_columns = [any(s.columns[i] < 0 for s in sources) for i in range(len(order))]

        def block_of(start: int, stop: int) -> np.ndarray:
            return relative_of(*(s.take(start, stop) for s in sources))
    else:
        rel = relative if relative is not None else result.relative_difference.sel(stat=stat)
        if steps is not None:
            rel = rel.sel(step=slice(steps[0], steps[1]))
        source = _Gather(rel.transpose("step", "site"), None, order)
        missing_columns = list(source.columns < 0)

        def block_of(start: int, stop: int) -> np.ndarray:
            return source.take(start, stop)
    if any(missing_columns) or (equal_columns < 0).any():
        missing = [site for site, gone, j in zip(order, missing_columns, equal_columns, strict=True) if gone or j < 0]
        raise KeyError(f"not sites both runs recorded: {', '.join(missing[:5])}")
    log = np.empty((is_equal.shape[0], len(order)))
    # block by block of steps (sites gathered within a row): this runs over every (step, site) whenever a
    # statistic is first shown, and a block's half-dozen passes then stay in the cache
    rows = max(1, _BLOCK_CELLS // max(len(order), 1))
    for start in range(0, log.shape[0], rows):
        block, out = block_of(start, start + rows), log[start:start + rows]
        with np.errstate(divide="ignore", invalid="ignore"):
            np.log10(block, out=out)
        np.copyto(out, 0.0, where=~np.isfinite(out))  # 0 (the statistic cannot see the difference), NaN or inf
        np.copyto(out, DIFFERS_ONLY_IN_BITS, where=block == 0)
        np.clip(out, DIFFERS_ONLY_IN_BITS, 0.0, out=out)
        np.copyto(out, BITWISE_EQUAL, where=is_equal[start:start + rows][:, equal_columns])
    return pd.DataFrame(log.T, index=pd.Index(order, name="site"), columns=equal.index)


class _Gather:
    """Rows (steps) and columns (sites, in the heatmap's order) of a (step, site) array, block by block:
    a slice where the steps are consecutive in it (no copy), else a gather. ``steps`` None: all of them."""

    def __init__(self, array: xr.DataArray, steps: pd.Index | None, order: list[str]) -> None:
        self.values = np.asarray(array.to_numpy(), dtype=float)
        self.columns = array.indexes["site"].get_indexer(order)
        self.in_order = bool(np.array_equal(self.columns, np.arange(self.values.shape[1])))
        rows = (np.arange(self.values.shape[0]) if steps is None else
                array.indexes["step"].get_indexer(steps))
        if (rows < 0).any():
            raise KeyError(f"steps not in both runs: {', '.join(map(str, np.asarray(steps)[rows < 0][:5]))}")
        consecutive = len(rows) == 0 or bool((np.diff(rows) == 1).all())
        self.first, self.count = (int(rows[0]) if len(rows) else 0), len(rows)
        self.rows = None if consecutive else rows

    def take(self, start: int, stop: int) -> np.ndarray:
        if self.rows is None:
            stop = min(stop, self.count)
            block = self.values[self.first + start:self.first + stop]
            return block if self.in_order else block[:, self.columns]
        return self.values[np.ix_(self.rows[start:stop], self.columns)]


MAX_COLUMNS = 400
"""Step columns of the heatmap at most (``divergence_heatmap``'s ``max_columns``, ``StepBins``')."""


@dataclass(frozen=True)
class StepBins:
    """A ``heatmap_matrix`` binned over steps as ``divergence_heatmap`` bins it at ``max_columns``: each site's
    largest value in each bin (columns: the first step of each bin), a few hundred columns whatever the run's
    length. ``divergence_heatmap(overview=...)`` draws the same figure from it as from the whole matrix, so a
    view of every step holds this instead (10k steps x 1k sites: 3 MB instead of 80)."""

    matrix: pd.DataFrame
    width: int
    """Columns of the whole matrix per bin."""
    last_step: int
    """The whole matrix's last column (the last bin's own last step)."""

    @classmethod
    def of(cls, matrix: pd.DataFrame, max_columns: int = MAX_COLUMNS) -> StepBins:
        width = _bins(matrix.shape[1], max_columns)
        binned = pd.DataFrame(_binned_max(matrix.to_numpy(), 1, width), index=matrix.index,
                              columns=matrix.columns[::width])
        return cls(binned, width, int(matrix.columns[-1]) if matrix.shape[1] else -1)

    @classmethod
    def of_values(cls, result: Comparison, values: tuple[xr.DataArray, xr.DataArray],
                  max_columns: int = MAX_COLUMNS) -> StepBins:
        """``of(heatmap_matrix(result, stat, values=values), max_columns)``, never making the whole matrix: a
        cell's value in the heatmap is a non-decreasing function of its relative difference (bitwise-equal
        cells below every difference, an undefined one above), so each bin's largest relative difference is
        found first, in the runs' own site order, and only the bins are turned into the heatmap's values and
        put in model order (10k steps x 1k sites: ``benchmarks/heatmap_matrix.py``)."""
        equal = result.equal
        sites = list(equal.columns)
        sources = [_Gather(v.transpose("step", "site"), equal.index, sites) for v in values]
        missing = [site for i, site in enumerate(sites) if any(s.columns[i] < 0 for s in sources)]
        if missing:
            raise KeyError(f"not sites both runs recorded: {', '.join(missing[:5])}")
        width = _bins(len(equal.index), max_columns)
        is_equal = equal.to_numpy()
        rows = max(1, _BLOCK_CELLS // max(len(sites), 1)) // width * width or width  # whole bins per block
        binned = np.empty((-(-len(equal.index) // width), len(sites)))  # [bin, site]
        for start in range(0, len(equal.index), rows):
            if is_equal[start:start + rows].all():  # every cell bitwise equal (all steps before the first
                binned[start // width:-(-min(start + rows, len(equal.index)) // width)] = -1.0  # divergence)
                continue
            block = relative_of(*(s.take(start, start + rows) for s in sources))  # [step, site]
            np.copyto(block, np.inf, where=~np.isfinite(block))  # undefined: drawn as 0, above every difference
            np.copyto(block, -1.0, where=is_equal[start:start + rows])  # below every difference
            binned[start // width:-(-(start + len(block)) // width)] = _binned_max(block, 0, width)
        with np.errstate(divide="ignore"):
            values_of_bins = np.clip(np.log10(np.where(binned < 0, 1.0, binned)), DIFFERS_ONLY_IN_BITS, 0.0)
        np.copyto(values_of_bins, BITWISE_EQUAL, where=binned < 0)
        matrix = pd.DataFrame(values_of_bins.T, index=pd.Index(sites, name="site"), columns=equal.index[::width])
        order = sites_in_model_order(sites)
        last = int(equal.index[-1]) if len(equal.index) else -1
        return cls(matrix if order == sites else matrix.loc[order], width, last)

    def rows(self, sites: list[str]) -> StepBins:
        """Only ``sites``' rows (in that order)."""
        return StepBins(self.matrix.loc[sites], self.width, self.last_step)

    @property
    def nbytes(self) -> int:
        return int(self.matrix.to_numpy().nbytes)


def divergence_heatmap(result: Comparison, stat: str = "l2", *, sites: list[str] | None = None,
                       steps: tuple[int, int] | None = None, max_rows: int = 600, max_columns: int = MAX_COLUMNS,
                       provenance: Provenance | None = None, matrix: pd.DataFrame | None = None,
                       overview: StepBins | None = None) -> go.Figure:
    """The heatmap described in the module docstring; ``matrix`` reuses a ``heatmap_matrix``, ``overview`` its
    ``StepBins`` (made at the same ``max_columns``), whose rows may be a selection of its sites."""
    if overview is not None:
        full, binned, last_step = overview.matrix, overview.width, overview.last_step
    else:
        full = matrix if matrix is not None else heatmap_matrix(result, stat, sites=sites, steps=steps)
        binned, last_step = 1, (int(full.columns.max()) if full.shape[1] else -1)
    row_width, column_width = _bins(full.shape[0], max_rows), _bins(full.shape[1], max_columns)
    row_starts, column_starts = np.arange(0, full.shape[0], row_width), np.arange(0, full.shape[1], column_width)
    z = _binned_max(_binned_max(full.to_numpy(), 1, column_width), 0, row_width)
    row_names = [str(full.index[i]) for i in row_starts]
    columns = [int(full.columns[j]) for j in column_starts]
    ticks = [BITWISE_EQUAL, DIFFERS_ONLY_IN_BITS, -15, -12, -9, -6, -3, 0]
    fig = go.Figure(go.Heatmap(
        z=z, x=columns, y=row_names, colorscale=_colorscale(), zmin=BITWISE_EQUAL, zmax=0,
        colorbar=dict(title=dict(text=f"log10 rel. diff<br>of {stat}", side="right"), thickness=14,
                      tickvals=ticks, ticktext=["equal", "bits only", *map(str, ticks[2:])]),
        hovertemplate="step %{x}<br>%{y}<br>log10 relative difference %{z:.2f}<extra></extra>", name="difference"))
    _mark_layers(fig, row_names)
    shown_steps = (int(full.columns.min()), last_step) if full.shape[1] else (0, -1)
    frontier = result.frontier.reindex([s for s in full.index if s in result.frontier.index]).dropna()
    frontier = frontier[(frontier >= shown_steps[0]) & (frontier <= shown_steps[1])]
    if len(frontier):
        y = _bin_names(list(frontier.index), full.index, row_starts)
        fig.add_trace(go.Scatter(x=frontier.to_numpy(), y=y, mode="lines", line=dict(color="#D55E00", width=1.5),
                                 name="frontier (first divergent step per site)",
                                 hovertemplate="%{y}<br>first differs at step %{x}<extra></extra>"))
    if result.first_site in full.index and result.first_step is not None and \
            shown_steps[0] <= result.first_step <= shown_steps[1]:
        y0 = _bin_names([str(result.first_site)], full.index, row_starts)[0]
        # its step and site in the legend, above the plot: a label over the matrix hid its cells at paper sizes
        first = f"first divergence: step {result.first_step}<br>{_broken(str(result.first_site))}"
        fig.add_trace(go.Scatter(x=[result.first_step], y=[y0], mode="markers", name=first,
                                 hovertemplate=first + "<extra></extra>",
                                 marker=dict(symbol="x", size=13, color="#000000", line=dict(width=2))))
    if result.identical and full.size:  # an all-grey matrix says it only through its colour bar
        fig.add_annotation(text="bitwise identical:<br>every site, every step", xref="paper", yref="paper", x=0.5,
                           y=0.5, showarrow=False, bgcolor="rgba(255,255,255,0.85)", font=dict(size=FONT_SIZE + 2))
    title = f"{result.a} vs {result.b}: " + ("bitwise identical" if result.identical else
                                             f"first divergence at step {result.first_step}")
    height = max(420, min(900, 14 * len(_layer_starts(row_names)) + 420))
    apply_style(fig, title=title, provenance=provenance, height=height)
    # the title and the legend (its rows as many as its entries need) stacked in the top margin: nothing over the plot
    entries = [str(t.name) for t in fig.data if t.type != "heatmap" and t.showlegend is not False]
    rows = legend_rows(entries) if entries else 0
    fig.update_layout(title=dict(yref="container", y=1.0, yanchor="top", pad=dict(t=14)),
                      margin=dict(t=_TITLE_BAND + _LEGEND_ROW * rows),
                      legend=dict(orientation="h", y=1.0, x=0, xanchor="left", yanchor="bottom"))
    fig.update_xaxes(title="step", showgrid=False, zeroline=False)
    # the labels stand clear of the plot: the first divergence's marker at the first step reaches past its column
    fig.update_yaxes(range=[len(row_names) - 0.5, -0.5], showgrid=False, title="site (model order)",
                     ticklabelstandoff=8)
    if columns:  # explicit: the markers would otherwise pad the axis beyond the matrix
        half = column_width * binned / 2
        fig.update_xaxes(range=[columns[0] - half, columns[-1] + half])
    return fig


_TITLE_BAND = 50
"""Pixels above the legend for the title, at the top of the figure."""
_LEGEND_ROW = 30
"""Pixels of one row of the horizontal legend."""


def _broken(name: str, width: int = 30) -> str:
    """``name`` over several lines (``<br>``) of at most ~``width`` characters, broken after dots: a legend entry
    that fits a paper's column."""
    lines = [""]
    for piece in re.split(r"(?<=\.)", name):  # each piece ends with its dot
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return "<br>".join(lines)


def _bin_names(sites: list[str], order: pd.Index, starts: np.ndarray) -> list[str]:
    """The row label (first site of its bin) under which each of ``sites`` is drawn."""
    bins = np.searchsorted(starts, order.get_indexer(sites), side="right") - 1
    return [str(order[starts[b]]) for b in bins]


def _layer_starts(rows: list[str]) -> list[int]:
    return [i for i, s in enumerate(rows) if i == 0 or layer_label(s) != layer_label(rows[i - 1])]


def _mark_layers(fig: go.Figure, rows: list[str]) -> None:
    """Each layer's label at the middle row of its band, and a thin line between layers. Bands too thin to
    hold a label of their own (the output layer and the loss, a few rows each) share the previous one's."""
    starts = _layer_starts(rows)
    gap = 0.035 * len(rows)  # rows per line of tick text, at screen and paper sizes alike
    ticks: list[tuple[int, str]] = []
    for start, end in zip(starts, [*starts[1:], len(rows)], strict=True):
        middle, label = (start + end - 1) // 2, layer_label(rows[start])
        if ticks and middle - ticks[-1][0] < gap:
            ticks[-1] = (ticks[-1][0], f"{ticks[-1][1]} · {label}")
        else:
            ticks.append((middle, label))
    fig.update_yaxes(tickmode="array", tickvals=[rows[i] for i, _ in ticks], ticktext=[t for _, t in ticks],
                     type="category")
    fig.update_layout(shapes=[dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=i - 0.5, y1=i - 0.5,
                                   line=dict(color="white", width=1)) for i in starts[1:]])


def amplification_figure(result: Comparison, stat: str = "l2", *, provenance: Provenance | None = None,
                         relative: xr.DataArray | None = None) -> go.Figure:
    """Relative difference against step on a log scale, per layer, with the fitted overall growth (``relative``:
    the relative difference of ``stat``, where the caller holds it, as ``Workspace.relative_difference``)."""
    fig = go.Figure()
    if result.identical:
        apply_style(fig, title=f"{result.a} vs {result.b}: bitwise identical, nothing to amplify",
                    provenance=provenance)
        return fig
    relative = result.relative(stat) if relative is None else relative
    table = per_layer_error(result, stat, rel=relative).loc[result.first_step:]
    for i, layer in enumerate(table.columns):
        series = table[layer].where(table[layer] > 0)
        fig.add_trace(go.Scatter(x=series.index, y=series.to_numpy(), mode="lines", name=str(layer),
                                 line=dict(**line_style(i), width=1.6)))
    growth = amplification(result, stat, rel=relative)
    if growth.fit_steps is not None:  # the fit is drawn only over the steps it describes
        steps = np.asarray([s for s in table.index if growth.fit_steps[0] <= s <= growth.fit_steps[1]], dtype=float)
        fit = 10.0 ** (growth.intercept + growth.rate * steps)
        fig.add_trace(go.Scatter(x=steps, y=fit, mode="lines", name=f"growth: {growth.rate:+.3f} decades/step",
                                 line=dict(color="#000000", dash="dash", width=2)))
    if growth.saturation_step is not None:
        flat = [s for s in table.index if s >= growth.saturation_step]
        fig.add_trace(go.Scatter(x=flat, y=[growth.plateau] * len(flat), mode="lines",
                                 name=f"saturates at step {growth.saturation_step}: {growth.plateau:.1e}",
                                 line=dict(color="#000000", dash="dot", width=2)))
    apply_style(fig, title=f"{result.a} vs {result.b}: growth of the relative difference of {stat} "
                f"after step {result.first_step}", provenance=provenance)
    fig.update_yaxes(type="log", title=f"relative difference of {stat}<br>(median over the layer's sites)",
                     exponentformat="power", ticklabelstandoff=6)  # the lowest label clear of the first step's
    fig.update_xaxes(title="step")
    return fig

"""The pair matrix as a figure: first divergent step of every pair, identical groups outlined.

    pairs_figure(ws.pair_matrix(), provenance=ws.provenance())

Pure: a ``PairMatrix`` in, a plotly figure out. Rows are run ``a``, columns run ``b``; a cell's
``customdata`` is ``[a, b]`` (the widget opens that pair in the explorer).
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from workbench.analysis.pairs import PairMatrix
from workbench.figures.style import EQUAL_COLOUR, FONT_SIZE, SEQUENTIAL, apply_style
from workbench.store.manifest import Provenance


def pairs_figure(matrix: PairMatrix, *, provenance: Provenance | None = None) -> go.Figure:
    """The pair matrix of a folder's runs: each cell the step where its pair first differs, ``=`` where they are
    bitwise identical, ``×`` where they cannot be compared."""
    names = matrix.names
    steps = matrix.first_step.to_numpy(dtype="float64", na_value=np.nan)
    identical = matrix.identical.to_numpy(dtype=bool)
    text = np.where(identical, "=", np.where(np.isnan(steps), "×", np.nan_to_num(steps).astype(int).astype(str)))
    pairs = np.array([[[a, b] for b in names] for a in names], dtype=object)
    fig = go.Figure()
    fig.add_trace(go.Heatmap(z=np.where(identical, 1.0, np.nan), x=names, y=names, showscale=False,
                             colorscale=[[0, EQUAL_COLOUR], [1, EQUAL_COLOUR]], hoverinfo="skip",
                             name="identical"))
    fig.add_trace(go.Heatmap(
        z=steps, x=names, y=names, text=text, texttemplate="%{text}", customdata=pairs, colorscale=SEQUENTIAL,
        colorbar=dict(title="first<br>divergent<br>step"), name="first divergent step",
        hovertemplate="%{y} vs %{x}: first divergent step %{z}<extra></extra>"))
    for group in matrix.groups:
        first, last = names.index(group[0]), names.index(group[-1])
        fig.add_shape(type="rect", x0=first - 0.5, x1=last + 0.5, y0=first - 0.5, y1=last + 0.5,
                      line=dict(color="#333333", width=2))
    fig.update_xaxes(tickangle=-45, side="bottom")
    fig.update_yaxes(autorange="reversed")
    size = 260 + 34 * len(names)
    groups = f"{len(matrix.groups)} group{'s' if len(matrix.groups) != 1 else ''} of identical runs outlined"
    apply_style(fig, title="first divergent step of every pair", provenance=provenance, height=size,
                width=size + 160)
    return fig.update_layout(title=dict(subtitle=dict(text=f"'=' bitwise identical; {groups}",
                                                      font=dict(size=FONT_SIZE, color="#555555"))),
                             margin=dict(t=80))

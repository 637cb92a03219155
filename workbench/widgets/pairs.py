"""The pair matrix widget: every pair of a folder's runs at a glance; click a cell to explore it.

    from workbench.widgets.pairs import PairMatrixWidget
    PairMatrixWidget("data/runs/demo")

The N x N figure of first divergent steps (``workbench.figures.pairs``), identical runs grouped;
clicking a cell opens that pair in a ``DivergenceExplorer`` below it. The export bar writes
the figure (PNG / SVG / PDF / HTML) and the pairs as CSV. Only wiring lives here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.analysis.pairs import PairMatrix
from workbench.studies import views
from workbench.studies.workspace import runs_dir
from workbench.widgets.common import Exported, WorkbenchWidget, figure_widget, open_workspace, show
from workbench.widgets.explorer import DivergenceExplorer
from workbench.words import counted


class PairMatrixWidget(WorkbenchWidget):
    """Every pair of the runs of ``directory`` at a glance (first divergent step, or identical); a click on a
    cell opens its explorer (see the module docstring)."""

    css_class = "workbench-pairs"

    def __init__(self, directory: str | Path | None = None) -> None:
        super().__init__()
        self.directory = str(directory or runs_dir())
        self.matrix: PairMatrix | None = None
        self.figure = figure_widget()
        self.explorer_box = widgets.VBox()
        self.explorer: DivergenceExplorer | None = None
        self.children = [self.status, self.figure, self.export_bar, self.explorer_box]
        self._quiet = False
        self.open_runs(self.directory)

    def exported(self) -> Exported | None:
        if self.matrix is None:
            return None
        return {"pair-matrix": go.Figure(self.figure)}, {"pair-matrix": self.matrix.table()}

    def open_runs(self, directory: str | Path) -> None:
        workspace = open_workspace(directory, self.status, pairs=True)
        if workspace is None:
            return
        view = views.pairs(workspace)
        matrix = view.result
        self.directory, self.workspace, self.matrix = str(directory), workspace, matrix
        show(self.figure, view.figure)
        self.figure.data[1].on_click(self._on_click)
        identical = sum(len(g) for g in matrix.groups)
        self.status.value = (f"{counted(len(matrix.names), 'run')}, {counted(len(matrix.groups), 'group')} of "
                             f"bitwise identical runs ({counted(identical, 'run')}); click a cell to explore that pair")

    def _on_click(self, trace: Any, points: Any, state: Any) -> None:
        if points.xs and points.ys:
            self.open_pair(str(points.ys[0]), str(points.xs[0]))

    def open_pair(self, a: str, b: str) -> DivergenceExplorer:
        """Show the divergence explorer for ``a`` against ``b`` below the matrix."""
        if self.explorer is None:
            self.explorer = DivergenceExplorer(self.directory, reference=a, other=b)
            self.explorer_box.children = [self.explorer]
        else:
            self.explorer.open_runs(self.directory, reference=a, other=b)
        return self.explorer


"""The sweep matrix widget: every pair of a folder's runs at a glance; click a cell to explore it.

    from workbench.widgets.sweep import SweepMatrixWidget
    SweepMatrixWidget("data/runs/demo")

The N x N figure of first divergent steps (``workbench.figures.sweep``), identical runs grouped;
clicking a cell opens that pair in a ``DivergenceExplorer`` below it. The export button writes
the figure (PNG / SVG / PDF / HTML) and the plotted data as CSV. Only wiring lives here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.analysis.sweep import SweepMatrix
from workbench.errors import WorkbenchError
from workbench.figures.sweep import sweep_figure
from workbench.widgets.explorer import EXPORT_FORMATS, DivergenceExplorer
from workbench.workspace import Workspace, runs_dir


class SweepMatrixWidget(widgets.VBox):
    def __init__(self, directory: str | Path | None = None) -> None:
        super().__init__()
        self.directory = str(directory or runs_dir())
        self.workspace: Workspace | None = None
        self.matrix: SweepMatrix | None = None
        self.status = widgets.HTML()
        self.figure = go.FigureWidget()
        self.export_folder = widgets.Text(value="figures", description="export to")
        self.export_formats = widgets.SelectMultiple(options=list(EXPORT_FORMATS), value=("png", "html"), rows=4,
                                                     description="formats")
        self.export_button = widgets.Button(description="export figure and CSV", icon="download")
        self.export_button.on_click(lambda _: self.export())
        self.explorer_box = widgets.VBox()
        self.explorer: DivergenceExplorer | None = None
        self.children = [self.status, self.figure,
                         widgets.HBox([self.export_folder, self.export_formats, self.export_button]),
                         self.explorer_box]
        self.open_runs(self.directory)

    def open_runs(self, directory: str | Path) -> None:
        try:
            workspace = Workspace.open(directory)
            matrix = workspace.sweep_matrix()
        except WorkbenchError as err:
            self.status.value = f"<b>cannot show {directory}</b>: {err}"
            return
        self.directory, self.workspace, self.matrix = str(directory), workspace, matrix
        figure = sweep_figure(matrix, provenance=workspace.provenance(matrix.names))
        with self.figure.batch_update():
            self.figure.data = ()
            self.figure.layout = figure.layout
            self.figure.add_traces(figure.data)
        self.figure.data[1].on_click(self._on_click)
        identical = sum(len(g) for g in matrix.groups)
        self.status.value = (f"{len(matrix.names)} runs, {len(matrix.groups)} groups of bitwise identical runs "
                             f"({identical} runs); click a cell to explore that pair")

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

    def export(self) -> list[Path]:
        from workbench.figures.export import export_figures

        if self.matrix is None:
            return []
        try:
            written = export_figures({"sweep-matrix": go.Figure(self.figure)}, self.export_folder.value,
                                     self.export_formats.value)
        except WorkbenchError as err:
            self.status.value = f"<b>export failed</b>: {err}"
            return []
        csv = Path(self.export_folder.value) / "sweep-matrix.csv"
        self.matrix.table().to_csv(csv, index=False)
        self.status.value = f"wrote {len(written) + 1} files to {Path(self.export_folder.value).resolve()}"
        return [*written, csv]

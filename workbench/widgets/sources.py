"""The sources widget: which nondeterminism source matters, each one alone against the reference.

    from workbench.widgets.sources import SourcesWidget
    SourcesWidget("data/runs/sources")       # `workbench sweep workbench/examples/sources.toml` makes it

Controls: the statistic compared, the warm-up steps left out of the cost and the bootstrap
interval. The figure is ``workbench.studies.views.sources`` (per source: its first divergent step
and site, its final relative difference from the reference, and what making it deterministic
costs), the table beside it the numbers. On a CPU each source is the workbench's emulation of it,
and its cost the emulation's; the figure says so. Export writes the figure and the table as CSV.
"""

from __future__ import annotations

from pathlib import Path

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.errors import ArgumentError
from workbench.statistics import STAT_NAMES
from workbench.studies import views
from workbench.studies.workspace import runs_dir
from workbench.widgets.common import Exported, WorkbenchWidget, figure_widget, open_workspace, show
from workbench.words import counted

SHOWN = ["source", "where_it_acts", "first_step", "first_site", "floor_exit_step", "final_error", "cost_percent",
         "cost_low", "cost_high"]
"""The table's columns (``analysis.sources.COLUMNS`` less the run and the exit site, which the figure names)."""


class SourcesWidget(WorkbenchWidget):
    """Which nondeterminism source matters: each one alone against the reference, in an attribution study's
    ``directory`` (see the module docstring)."""

    css_class = "workbench-sources"

    def __init__(self, directory: str | Path | None = None, *, stat: str = "l2") -> None:
        super().__init__()
        style = {"description_width": "initial"}
        self.table = pd.DataFrame()
        self.stat = widgets.Dropdown(options=list(STAT_NAMES), value=stat, description="statistic", style=style)
        self.warmup = widgets.IntSlider(value=2, min=0, max=20, description="warm-up steps left out", style=style)
        self.interval = widgets.Dropdown(options=[80.0, 90.0, 95.0, 99.0], value=95.0,
                                         description="bootstrap interval %", style=style)
        self.figure = figure_widget()
        self.numbers = widgets.Output()
        self.children = [widgets.HBox([self.stat, self.warmup, self.interval]), self.status, self.figure,
                         self.numbers, self.export_bar]
        self.workspace = open_workspace(directory or runs_dir(), self.status)
        self.watch(self.stat, self.warmup, self.interval)
        self.update()

    def update(self) -> None:
        if self._quiet or self.workspace is None:
            return
        try:
            view = views.sources(self.workspace, self.stat.value, warmup=self.warmup.value,
                                 interval=self.interval.value)
        except ArgumentError as err:
            self.table = pd.DataFrame()
            self.status.value = str(err)
            return
        self.table = view.data
        show(self.figure, view.figure)
        self.numbers.clear_output()
        with self.numbers:
            print(self.table[[c for c in SHOWN if c in self.table]].to_string(
                index=False, float_format=lambda x: f"{x:.3g}"))
        self.status.value = (f"{counted(len(self.table), 'source')} against {self.workspace.roles.reference} "
                             f"({self.stat.value}; cost over {self.interval.value:g}% intervals)")

    def exported(self) -> Exported | None:
        if self.table.empty:
            return None
        return {"sources": go.Figure(self.figure)}, {"sources": self.table}

"""The cost widget: what deterministic mode costs in throughput, per configuration and per source.

    from workbench.widgets.cost import CostWidget
    CostWidget("data/runs/demo")

Controls: the configurations, the measure (tokens/s with the recorder's time left out, or
steps/s from the step time), the warm-up steps left out of each run and the bootstrap
interval. The figure is ``workbench.studies.views.cost``, the table beside it the
numbers; where the folder holds an attribution study (``workbench/examples/sources.toml``), a
second figure and table give each nondeterminism source's cost against the runs with every
source off. On a CPU the caveat is shown with them (CPU kernels are deterministic either way, so
the only cost measured there is the emulation's). Export writes the figures and the tables as CSV.
"""

from __future__ import annotations

from pathlib import Path

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.errors import ArgumentError
from workbench.studies import views
from workbench.studies.workspace import runs_dir
from workbench.widgets.common import Exported, WorkbenchWidget, figure_widget, fill_list, open_workspace, show
from workbench.words import counted

MEASURES = {"tokens/s (recorder excluded)": "tokens_per_s", "steps/s (from the step time)": "step_time"}
CPU_CAVEAT = ("On a CPU every kernel is deterministic: a 'default' run differs only by the workbench's emulation "
              "of GPU atomics, so this is the cost of that emulation, not of deterministic GPU kernels.")


class CostWidget(WorkbenchWidget):
    """What deterministic mode costs in throughput, per configuration and per source, for the runs of
    ``directory`` (default: ``runs_dir()``); see the module docstring."""

    css_class = "workbench-cost"

    def __init__(self, directory: str | Path | None = None) -> None:
        super().__init__()
        style = {"description_width": "initial"}
        self.table = pd.DataFrame()
        self.configs = widgets.SelectMultiple(description="configurations", rows=6, style=style,
                                              layout=widgets.Layout(width="460px"))
        self.measure = widgets.Dropdown(options=list(MEASURES), description="measure", style=style)
        self.warmup = widgets.IntSlider(value=2, min=0, max=20, description="warm-up steps left out", style=style)
        self.interval = widgets.Dropdown(options=[80.0, 90.0, 95.0, 99.0], value=95.0,
                                         description="bootstrap interval %", style=style)
        self.caveat = widgets.HTML()
        self.figure = figure_widget()
        self.numbers = widgets.Output()
        self.by_source = pd.DataFrame()
        self.source_figure = figure_widget()
        self.source_numbers = widgets.Output()
        self.source_box = widgets.VBox([self.source_figure, self.source_numbers])
        self.children = [widgets.HBox([self.configs, widgets.VBox([self.measure, self.warmup, self.interval])]),
                         self.status, self.caveat, self.figure, self.numbers, self.source_box, self.export_bar]
        self.open_runs(directory or runs_dir())
        self.watch(self.configs, self.measure, self.warmup, self.interval)
        self.update()

    def open_runs(self, directory: str | Path) -> None:
        self.workspace = open_workspace(directory, self.status)
        if self.workspace is None:
            return
        configs = self.workspace.configurations
        fill_list(self.configs, configs)
        self.configs.value = tuple(configs)
        self.caveat.value = f"<i>{CPU_CAVEAT}</i>" if self.workspace.on_cpu else ""

    def update(self) -> None:
        if self._quiet or self.workspace is None:
            return
        measure, warmup, interval = MEASURES[self.measure.value], self.warmup.value, self.interval.value
        self.numbers.clear_output()
        try:
            view = views.cost(self.workspace, measure=measure, warmup=warmup, interval=interval,
                              configs=self.configs.value)
        except ArgumentError as err:
            self.table = pd.DataFrame()
            show(self.figure, go.Figure())
            self.status.value = str(err)
        else:
            self.table = view.data
            show(self.figure, view.figure)
            with self.numbers:
                print(self.table.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
            self.status.value = f"{counted(len(self.table), 'configuration')} with both modes ({views.RATES[measure]})"
        self.source_numbers.clear_output()
        try:
            by_source = views.source_cost(self.workspace, measure=measure, warmup=warmup, interval=interval)
        except ArgumentError:
            self.by_source = pd.DataFrame()
            self.source_box.layout.display = "none"
            return
        self.by_source = by_source.data
        self.source_box.layout.display = None
        show(self.source_figure, by_source.figure)
        with self.source_numbers:
            print(self.by_source.rename(columns={"config": "source"}).to_string(
                index=False, float_format=lambda x: f"{x:.2f}"))
        self.status.value += f"; {len(self.by_source)} nondeterminism sources against every source off"

    def exported(self) -> Exported | None:
        if self.table.empty:
            return None
        figures, tables = {"determinism-cost": go.Figure(self.figure)}, {"determinism-cost": self.table}
        if not self.by_source.empty:
            figures["source-cost"], tables["source-cost"] = go.Figure(self.source_figure), self.by_source
        return figures, tables

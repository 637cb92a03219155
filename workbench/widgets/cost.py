"""The cost widget: what deterministic mode costs in throughput, per configuration and per source.

    from workbench.widgets.cost import CostWidget
    CostWidget("data/runs/demo")

Controls: the configurations, the measure (tokens/s with the recorder's time left out, or
steps/s from the step time), the warm-up steps left out of each run and the bootstrap
interval. The figure is ``workbench.figures.cost.cost_figure``, the table beside it the
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

from workbench.figures.cost import cost_figure
from workbench.studies.workspace import runs_dir
from workbench.widgets.common import Exported, WorkbenchWidget, open_workspace, show

MEASURES = {"tokens/s (recorder excluded)": "tokens_per_s", "steps/s (from the step time)": "step_time"}
CPU_CAVEAT = ("On a CPU every kernel is deterministic: a 'default' run differs only by the workbench's emulation "
              "of GPU atomics, so this is the cost of that emulation, not of deterministic GPU kernels.")


class CostWidget(WorkbenchWidget):
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
        self.figure = go.FigureWidget()
        self.numbers = widgets.Output()
        self.by_source = pd.DataFrame()
        self.source_figure = go.FigureWidget()
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
        self.configs.options, self.configs.value = configs, tuple(configs)
        self.caveat.value = f"<i>{CPU_CAVEAT}</i>" if self.workspace.on_cpu else ""

    def update(self) -> None:
        if self._quiet or self.workspace is None:
            return
        measure = MEASURES[self.measure.value]
        self.table = self.workspace.cost(measure=measure, warmup=self.warmup.value, interval=self.interval.value,
                                         configs=self.configs.value)
        rate = "tokens per second" if measure == "tokens_per_s" else "steps per second"
        figure = cost_figure(self.table, provenance=self.workspace.provenance(), rate=rate,
                             interval=self.interval.value)
        show(self.figure, figure)
        self.numbers.clear_output()
        with self.numbers:
            print(self.table.to_string(index=False, float_format=lambda x: f"{x:.2f}") if not self.table.empty
                  else "no configuration here has both deterministic and default runs")
        self.status.value = f"{len(self.table)} configurations with both modes ({rate})"
        self.by_source = self.workspace.source_cost(measure=measure, warmup=self.warmup.value,
                                                    interval=self.interval.value)
        self.source_box.layout.display = None if not self.by_source.empty else "none"
        if not self.by_source.empty:
            show(self.source_figure, cost_figure(self.by_source, provenance=self.workspace.provenance(), rate=rate,
                                                 interval=self.interval.value, sides=("every source off", "source on"),
                                                 title="what making each nondeterminism source deterministic costs"))
            self.source_numbers.clear_output()
            with self.source_numbers:
                print(self.by_source.rename(columns={"config": "source"}).to_string(
                    index=False, float_format=lambda x: f"{x:.2f}"))
            self.status.value += f"; {len(self.by_source)} nondeterminism sources against every source off"

    def exported(self) -> Exported | None:
        if not self.figure.data:
            return None
        figures, tables = {"determinism-cost": go.Figure(self.figure)}, {"determinism-cost": self.table}
        if not self.by_source.empty:
            figures["source-cost"], tables["source-cost"] = go.Figure(self.source_figure), self.by_source
        return figures, tables

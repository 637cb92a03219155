"""The cost widget: what deterministic mode costs in throughput, per configuration.

    from workbench.widgets.cost import CostWidget
    CostWidget("data/runs/demo")

Controls: the configurations, the measure (tokens/s with the recorder's time left out, or
steps/s from the step time), the warm-up steps left out of each run and the bootstrap
interval. The figure is ``workbench.figures.studies.cost_figure``, the table beside it the
numbers; on a CPU the caveat is shown with them (CPU kernels are deterministic either way, so
the only cost measured there is the emulation's). Export writes the figure and the table as CSV.
"""

from __future__ import annotations

from pathlib import Path

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.figures.studies import cost_figure
from workbench.widgets.common import ExportBar, open_workspace, show
from workbench.workspace import Workspace, runs_dir

MEASURES = {"tokens/s (recorder excluded)": "tokens_per_s", "steps/s (from the step time)": "step_time"}
CPU_CAVEAT = ("On a CPU every kernel is deterministic: a 'default' run differs only by the workbench's emulation "
              "of GPU atomics, so this is the cost of that emulation, not of deterministic GPU kernels.")


class CostWidget(widgets.VBox):
    def __init__(self, directory: str | Path | None = None) -> None:
        super().__init__()
        self.add_class("workbench-cost")  # for the browser test and user CSS
        style = {"description_width": "initial"}
        self.workspace: Workspace | None = None
        self.table = pd.DataFrame()
        self.configs = widgets.SelectMultiple(description="configurations", rows=6, style=style,
                                              layout=widgets.Layout(width="460px"))
        self.measure = widgets.Dropdown(options=list(MEASURES), description="measure", style=style)
        self.warmup = widgets.IntSlider(value=2, min=0, max=20, description="warm-up steps left out", style=style)
        self.interval = widgets.Dropdown(options=[80.0, 90.0, 95.0, 99.0], value=95.0,
                                         description="bootstrap interval %", style=style)
        self.status = widgets.HTML()
        self.caveat = widgets.HTML()
        self.figure = go.FigureWidget()
        self.numbers = widgets.Output()
        self.export_bar = ExportBar(self.status, lambda: None if not self.figure.data else (
            {"determinism-cost": go.Figure(self.figure)}, {"determinism-cost": self.table}))
        self.children = [widgets.HBox([self.configs, widgets.VBox([self.measure, self.warmup, self.interval])]),
                         self.status, self.caveat, self.figure, self.numbers, self.export_bar]
        self._quiet = True
        self.open_runs(directory or runs_dir())
        for control in (self.configs, self.measure, self.warmup, self.interval):
            control.observe(lambda _: self.update(), names="value")
        self._quiet = False
        self.update()

    def open_runs(self, directory: str | Path) -> None:
        self.workspace = open_workspace(directory, self.status)
        if self.workspace is None:
            return
        configs = self.workspace.configurations
        self.configs.options, self.configs.value = configs, tuple(configs)
        on_cpu = any(r.manifest.get("runtime", {}).get("device", "cpu").startswith("cpu") for r in
                     self.workspace.runs.values() if isinstance(r.manifest.get("runtime"), dict))
        self.caveat.value = f"<i>{CPU_CAVEAT}</i>" if on_cpu else ""

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

    def export(self) -> list[Path]:
        return self.export_bar.export()

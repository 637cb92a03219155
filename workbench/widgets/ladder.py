"""The precision / layout widget: runs against a reference, layer by layer, with the noise floor.

    from workbench.widgets.ladder import LadderWidget
    LadderWidget("data/runs/demo")                   # precisions, layouts, ... against the reference

Controls: the reference, the runs compared with it, the statistic and the layer range. The
figure is the ladder (``workbench.figures.ladder.ladder_figure``: relative difference per
layer at the last step, and over steps) with the noise floor of nondeterministic repeats and
the seed-to-seed spread (runs that differ only in seed; on or off);
clicking a run's point at a layer opens a divergence explorer below on that pair, filtered to
that layer's sites, where clicking a site shows its trajectories and, where snapshots exist,
the element-wise comparison. Export writes the figure and the per-layer table as CSV.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.analysis.ladder import Ladder
from workbench.sites import labelled_layer, layer_label, layer_order
from workbench.statistics import STAT_NAMES
from workbench.studies import views
from workbench.studies.reading_ahead import Pause
from workbench.studies.workspace import Workspace, runs_dir
from workbench.widgets.common import Exported, WorkbenchWidget, figure_widget, fill_list, open_workspace, show
from workbench.widgets.explorer import DivergenceExplorer
from workbench.words import counted


class LadderWidget(WorkbenchWidget):
    """Runs of ``directory`` against the reference, layer by layer, with the noise floor and the seed-to-seed
    spread (see the module docstring)."""

    css_class = "workbench-ladder"

    def __init__(self, directory: str | Path | None = None, *, runs: list[str] | None = None,
                 stat: str = "l2") -> None:
        super().__init__()
        style = {"description_width": "initial"}
        self.directory = str(directory or runs_dir())
        self.ladder: Ladder | None = None
        self.reference = widgets.Dropdown(description="reference", style=style)
        self.runs = widgets.SelectMultiple(description="compared runs", rows=6, style=style)
        self.stat = widgets.Dropdown(options=list(STAT_NAMES), value=stat, description="statistic", style=style)
        self.layers = widgets.IntRangeSlider(description="layers", min=0, max=0, value=(0, 0), style=style,
                                             continuous_update=False)
        self.outside_layers = widgets.Checkbox(value=True, description="embedding, head and loss", indent=False)
        self.seeds = widgets.Checkbox(value=True, description="seed spread", indent=False)
        self.figure = figure_widget()
        self.explorer_box = widgets.VBox()
        self.explorer: DivergenceExplorer | None = None
        self.children = [widgets.HBox([widgets.VBox([self.reference, self.stat, self.layers, self.outside_layers,
                                                     self.seeds]),
                                       self.runs]),
                         self.status, self.figure, self.export_bar, self.explorer_box]
        self.open_runs(self.directory, runs=runs)
        self.watch(self.reference, self.runs, self.stat, self.layers, self.outside_layers, self.seeds)
        self.update()
        self._preload()

    def _preload(self) -> None:
        """Every statistic of the runs shown, in the background, once the first ladder is drawn; then the
        ladders and bands of the other statistics."""
        if self.workspace is None:
            return
        ws, reference = self.workspace, self.reference.value
        names = tuple(n for n in self.runs.value if n != reference)
        ws.preload([reference, *names, *ws.roles.floor_runs, *ws.roles.seed_runs, *ws.roles.band_runs])
        ws.read_ahead([partial(_ladders_of, ws, reference, names, stat)
                       for stat in self.stat.options if stat != self.stat.value and names])

    def open_runs(self, directory: str | Path, *, runs: list[str] | None = None) -> None:
        workspace = open_workspace(directory, self.status, pairs=True)
        if workspace is None:
            return
        self.directory, self.workspace = str(directory), workspace
        self.reference.options, self.reference.value = workspace.recorded, workspace.roles.reference
        fill_list(self.runs, list(workspace.recorded))
        chosen = runs or workspace.roles.others or [n for n in workspace.recorded if n != workspace.roles.reference][:3]
        self.runs.value = tuple(n for n in chosen if n in workspace.recorded and n != workspace.roles.reference)
        numbered = [n for n in map(labelled_layer, self._labels(workspace)) if n is not None]
        self.layers.max, self.layers.min = max(numbered, default=0), 0
        self.layers.value = (0, max(numbered, default=0))
        if not self._quiet:  # opened again later: its ladder is drawn by now
            self._preload()

    @staticmethod
    def _labels(workspace: Workspace) -> list[str]:
        return layer_order(sorted({layer_label(s) for s in workspace.runs[workspace.roles.reference].site_names()}))

    def _kept(self, label: str) -> bool:
        layer = labelled_layer(label)
        if layer is not None:
            return bool(self.layers.value[0] <= layer <= self.layers.value[1])
        return bool(self.outside_layers.value)

    def update(self) -> None:
        if self._quiet or self.workspace is None:
            return
        with self.workspace.foreground():  # the background's next read waits for this view
            self._update()

    def _update(self) -> None:
        assert self.workspace is not None
        reference = self.reference.value
        names = [n for n in self.runs.value if n != reference]
        if not names:
            self.status.value = "choose one or more runs to compare with the reference"
            return
        view = views.ladder(self.workspace, names, reference=reference, stat=self.stat.value, seeds=self.seeds.value,
                            layers=self._kept)
        self.ladder = view.result
        show(self.figure, view.figure)
        for trace in self.figure.data:  # a run's line and the triangle where it leaves the floor: its legend group
            if trace.legendgroup in names and trace.xaxis in (None, "x"):
                trace.on_click(self._on_click)
        self.status.value = (f"{counted(len(names), 'run')} against {reference}, {self.stat.value}; click a run's "
                             "point at a layer to see that layer's sites")

    def _on_click(self, trace: Any, points: Any, state: Any) -> None:
        if points.xs:
            self.open_layer(str(trace.legendgroup), str(points.xs[0]))

    def open_layer(self, run: str, layer: str) -> DivergenceExplorer:
        """The divergence explorer on (reference, ``run``), filtered to the sites of ``layer``."""
        reference = self.reference.value
        if self.explorer is None:
            self.explorer = DivergenceExplorer(self.directory, reference=reference, other=run)
            self.explorer_box.children = [self.explorer]
        else:
            self.explorer.open_runs(self.directory, reference=reference, other=run)
        explorer = self.explorer
        explorer.stat.value = self.stat.value
        number = labelled_layer(layer)
        if number is not None:
            explorer.site_glob.value = "*"
            explorer.layers.value = (number, number)
            explorer.outside_layers.value = False
        else:
            explorer.outside_layers.value = True
            explorer.site_glob.value = "loss:*" if layer == "loss" else f"*:{layer}*"
        return explorer

    def exported(self) -> Exported | None:
        if self.ladder is None:
            return None
        return {"ladder": go.Figure(self.figure)}, {"ladder": self.ladder.per_layer}


def _ladders_of(workspace: Workspace, reference: str, names: tuple[str, ...], stat: str, pause: Pause) -> int:
    """Compute (held by the workspace) the ladder of ``names`` against ``reference`` and the noise-floor, rounding
    and seed ladders for ``stat``, reading with the background's ``pause``; 0 bytes held beyond the workspace's
    relative differences (which it counts itself)."""
    workspace.ladder(names, reference=reference, stat=stat, pause=pause)
    workspace.noise_ladder(reference=reference, stat=stat, pause=pause)
    workspace.band_ladder(reference=reference, stat=stat, pause=pause)
    workspace.seed_ladder(reference=reference, stat=stat, pause=pause)
    return 0

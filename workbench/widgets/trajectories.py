"""The trajectory widget: any scalar, or any site's statistic, of several runs against a reference.

    from workbench.widgets.trajectories import TrajectoryWidget
    TrajectoryWidget("data/runs/demo")               # runs, quantity, reference, panels, ranges
    trajectories.follow(explorer)                    # a click on the explorer's heatmap opens that site here

Controls: the runs (several), the quantity (a per-step scalar, or "site statistic" with a site
and a statistic), the reference, the difference panel (|difference| on a log scale, the default; the signed difference;
the signed relative difference), log scale of the values,
the step range, the two bands a difference is judged against (the noise floor of
nondeterministic repeats, the seed-to-seed spread of runs that differ only in seed; for
``val_loss``, the held-out loss, the second is the one that says whether a change matters)
and the anomalies marked. Export writes the figure
(PNG / SVG / PDF / HTML) and the plotted series as CSV. Only wiring lives here: figure and
data from ``workbench.studies.views.trajectories``.
"""

from __future__ import annotations

import time
from pathlib import Path

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.errors import ArgumentError
from workbench.statistics import STAT_NAMES
from workbench.store.layout import SCALAR_FIELDS
from workbench.studies import views
from workbench.studies.workspace import runs_dir
from workbench.widgets.common import Exported, WorkbenchWidget, figure_widget, fill_list, open_workspace, show
from workbench.widgets.explorer import DivergenceExplorer
from workbench.words import counted

SITE_STATISTIC = "site statistic"
MAGNITUDE = "|difference|"
DIFFERENCES = {MAGNITUDE: "its magnitude on a log scale", "difference": "signed, linear",
               "relative": "divided by the reference's magnitude, signed"}
"""The difference panel's choices (the first is the default: 1e-7 and 1e-1 both visible)."""
_SCALARS = [name for name, dtype in SCALAR_FIELDS.items() if dtype.startswith("float")]


class TrajectoryWidget(WorkbenchWidget):
    """Any scalar, or any site's statistic, of several runs of ``directory`` against a reference (see the module
    docstring)."""

    css_class = "workbench-trajectories"

    def __init__(self, directory: str | Path | None = None, *, runs: list[str] | None = None,
                 quantity: str = "loss", site: str | None = None, stat: str = "l2") -> None:
        super().__init__()
        style = {"description_width": "initial"}
        self.last_update_s = 0.0
        self.plotted = pd.DataFrame()
        """The series drawn last, one column per run (what the export bar writes as CSV)."""
        self._read_ahead: tuple[str, tuple[str, ...]] | None = None  # (site, runs) whose statistics are read ahead
        self.runs = widgets.SelectMultiple(description="runs", rows=6, style=style)
        self.reference = widgets.Dropdown(description="reference", style=style)
        self.quantity = widgets.Dropdown(options=[*_SCALARS, SITE_STATISTIC], value=quantity if quantity in
                                         _SCALARS else SITE_STATISTIC, description="quantity", style=style)
        self.site = widgets.Combobox(description="site", placeholder="kind:name", ensure_option=True, style=style,
                                     layout=widgets.Layout(width="420px"))
        self.stat = widgets.Dropdown(options=list(STAT_NAMES), value=stat, description="statistic", style=style)
        self.difference = widgets.ToggleButtons(options=list(DIFFERENCES), value=MAGNITUDE, description="difference",
                                                style={**style, "button_width": "7.5em"},  # in a row, not shrunk
                                                layout=widgets.Layout(flex="0 0 auto", width="auto"))
        self.log_y = widgets.Checkbox(value=False, description="log scale", indent=False)
        self.floor = widgets.Checkbox(value=True, description="noise floor", indent=False)
        self.seeds = widgets.Checkbox(value=True, description="seed spread", indent=False)
        self.anomalies = widgets.Checkbox(value=False, description="anomalies", indent=False)
        self.steps = widgets.IntRangeSlider(description="steps", min=0, max=0, value=(0, 0), style=style,
                                            continuous_update=False, layout=widgets.Layout(width="420px"))
        self.figure = figure_widget()
        self.children = [
            widgets.HBox([self.runs, widgets.VBox([self.reference, self.quantity, self.site, self.stat])]),
            widgets.HBox([self.difference, self.log_y, self.floor, self.seeds, self.anomalies]),
            self.steps, self.status, self.figure, self.export_bar,
        ]
        self.open_runs(directory or runs_dir(), runs=runs, site=site)
        self.watch(self.runs, self.reference, self.quantity, self.site, self.stat, self.difference, self.log_y,
                   self.floor, self.seeds, self.anomalies, self.steps)
        self.update()
        self._preload()

    def open_runs(self, directory: str | Path, *, runs: list[str] | None = None, site: str | None = None) -> None:
        workspace = open_workspace(directory, self.status)
        if workspace is None:
            return
        quiet, self._quiet = self._quiet, True
        self.workspace, self._read_ahead = workspace, None
        roles = workspace.roles
        chosen = [n for n in (runs or [roles.reference, *roles.floor_runs, *roles.others][:6])
                  if n in workspace.runs]
        fill_list(self.runs, list(workspace.names))
        self.runs.value = tuple(dict.fromkeys(chosen))
        self.reference.options = workspace.names
        self.reference.value = chosen[0] if chosen else workspace.names[0]
        sites = sorted({s for n in workspace.recorded for s in workspace.runs[n].site_names()})
        self.site.options = sites
        self.site.value = site if site in sites else (sites[0] if sites else "")
        last = max((workspace.runs[n].steps_completed for n in workspace.names), default=1) - 1
        self.steps.max, self.steps.min = max(last, 0), 0
        self.steps.value = (0, max(last, 0))
        self._quiet = quiet
        if not quiet:  # opened again later: the first figure is drawn by now
            self._preload()

    def _preload(self) -> None:
        """The site statistics of the runs chosen, the noise-floor and the seed runs, read ahead in the
        background (once the first figure is drawn, so as not to slow it down)."""
        if self.workspace is not None:
            ws = self.workspace
            ws.preload([*self.runs.value, *ws.roles.floor_runs, *ws.roles.seed_runs])

    def view(self) -> views.View:
        """What the controls ask for (``studies.views.trajectories``)."""
        assert self.workspace is not None
        site_mode = self.quantity.value == SITE_STATISTIC
        return views.trajectories(self.workspace, self.stat.value if site_mode else self.quantity.value,
                                  list(self.runs.value), site=self.site.value if site_mode else None,
                                  reference=self.reference.value, steps=self.steps.value, floor=self.floor.value,
                                  seeds=self.seeds.value, anomalies=self.anomalies.value, log_y=self.log_y.value,
                                  relative=self.difference.value == "relative",
                                  magnitude=self.difference.value == MAGNITUDE)

    def update(self) -> None:
        if self._quiet or self.workspace is None:
            return
        with self.workspace.foreground():  # the background's next read waits for this view
            self._update()

    def _update(self) -> None:
        assert self.workspace is not None
        start = time.perf_counter()
        try:
            view = self.view()
        except ArgumentError:
            self.status.value = "choose runs (with per-site records for a site statistic)"
            return
        self.plotted = view.data
        show(self.figure, view.figure)
        self.last_update_s = time.perf_counter() - start
        ws = self.workspace
        ahead = (self.site.value, (*self.runs.value, *ws.roles.floor_runs, *ws.roles.seed_runs))
        if self.quantity.value == SITE_STATISTIC and ahead != self._read_ahead:
            self._read_ahead = ahead  # the site's other statistics, read ahead in the background
            ws.read_site_ahead(*ahead)
        quantity = f"{self.stat.value} of {self.site.value}" if self.quantity.value == SITE_STATISTIC \
            else self.quantity.value
        reference = self.reference.value if self.reference.value in view.data else view.data.columns[0]
        self.status.value = (f"{quantity}: {counted(len(view.data.columns), 'run')} against {reference} "
                             f"(updated in {1000 * self.last_update_s:.0f} ms)")

    def show_site(self, site: str, stat: str | None = None, runs: list[str] | None = None) -> None:
        """Show one site's statistic (from a click elsewhere, e.g. the divergence explorer)."""
        quiet, self._quiet = self._quiet, True
        if runs:
            self.runs.value = tuple(r for r in runs if r in self.runs.options)
            self.reference.value = runs[0]
        self.quantity.value = SITE_STATISTIC
        if stat is not None:
            self.stat.value = stat
        self.site.value = site
        self._quiet = quiet
        self.update()

    def follow(self, explorer: DivergenceExplorer) -> None:
        """Open here every site clicked in ``explorer``'s heatmap (with its pair of runs and statistic)."""
        explorer.site_listeners.append(lambda site, stat, runs: self.show_site(site, stat, runs))

    def exported(self) -> Exported | None:
        if not self.figure.data:
            return None
        return {"trajectories": go.Figure(self.figure)}, {"trajectories": self.plotted}

"""The divergence explorer: pick runs, a statistic, sites and steps; see where two runs diverge.

    from workbench.widgets.explorer import DivergenceExplorer
    DivergenceExplorer("data/runs/demo")          # the last expression of a notebook cell shows it

Controls: the runs folder, the reference and the compared run, the statistic, a site filter
(glob, kinds, layer range), the step range, and an export button that writes the current
figures to a folder as PNG / SVG / PDF / HTML and the heatmap's data as CSV. Views: the divergence heatmap; clicking a
cell shows that site's statistic over steps in both runs and, where both runs have
snapshots of it at that step, the element-wise comparison. Only wiring lives here: data
comes from ``Workspace``, figures from ``workbench.figures``. ``last_update_s`` holds the
time of the last update, for the latency benchmark.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from IPython.display import display

from workbench.errors import WorkbenchError
from workbench.figures.divergence import StepBins, divergence_heatmap
from workbench.figures.elementwise import elementwise_figure
from workbench.figures.style import run_styles
from workbench.figures.trajectories import trajectory_figure
from workbench.sites import SITE_KINDS, layer_label, layer_of, site_matcher, split_site
from workbench.statistics import STAT_NAMES
from workbench.studies.workspace import runs_dir
from workbench.widgets.common import Exported, WorkbenchWidget, figure_widget, open_workspace, show


class DivergenceExplorer(WorkbenchWidget):
    """Where two runs of ``directory`` (default: ``runs_dir()``) diverge: a heatmap of sites by steps, a click
    shows that site's steps; ``reference`` and ``other`` pick the pair (see the module docstring)."""

    css_class = "workbench-explorer"

    def __init__(self, directory: str | Path | None = None, *, reference: str | None = None,
                 other: str | None = None) -> None:
        super().__init__()
        self.last_update_s = 0.0
        self.selected: tuple[str, int] | None = None
        self._detail: tuple[str, str, str] | None = None  # what the site detail shows: the pair, the statistic
        self._site_steps: dict[str, int] = {}  # the listed sites that differ: their first divergent step
        self._listed: set[str] = set()  # the sites in the site list
        style = {"description_width": "initial"}
        wide = widgets.Layout(width="420px")
        self.directory = widgets.Text(value=str(directory or runs_dir()), description="runs folder",
                                      style=style, layout=widgets.Layout(width="520px"))
        self.open_button = widgets.Button(description="open", button_style="primary")
        self.reference = widgets.Dropdown(description="reference", style=style, layout=wide)
        self.other = widgets.Dropdown(description="compared with", style=style, layout=wide)
        self.stat = widgets.Dropdown(options=list(STAT_NAMES), value="l2", description="statistic", style=style)
        self.site_glob = widgets.Text(value="*", description="sites (glob)", style=style, continuous_update=False)
        self.kinds = widgets.SelectMultiple(options=list(SITE_KINDS), value=tuple(SITE_KINDS), description="kinds",
                                            rows=5, style=style)
        self.layers = widgets.IntRangeSlider(description="layers", min=0, max=0, value=(0, 0), style=style,
                                             continuous_update=False)
        self.outside_layers = widgets.Checkbox(value=True, description="embedding, head and loss", indent=False)
        self.steps = widgets.IntRangeSlider(description="steps", min=0, max=0, value=(0, 0), style=style,
                                            layout=wide, continuous_update=False)
        self.heatmap = figure_widget()
        self.site_list = widgets.Dropdown(description="site (in order of first divergence)", options=[], style=style,
                                          layout=widgets.Layout(width="640px"))
        """The shown sites, those that differ first in the order they first differ, then the rest in model
        order: choosing one shows it as a click on its first divergent cell does."""
        self.detail = figure_widget()
        self.snapshot_view = widgets.Output()
        self.children = [
            widgets.HBox([self.directory, self.open_button]),
            widgets.HBox([self.reference, self.other, self.stat]),
            widgets.HBox([widgets.VBox([self.site_glob, self.layers, self.outside_layers, self.steps]), self.kinds]),
            self.status, self.heatmap, self.site_list, self.detail, self.snapshot_view,
            self.export_bar,
        ]
        self.open_button.on_click(lambda _: self.open_runs(self.directory.value))
        self.site_list.observe(self._on_site_chosen, names="value")
        self.watch(self.reference, self.other, self.stat, self.site_glob, self.kinds, self.layers,
                   self.outside_layers, self.steps)
        self.site_listeners: list[Callable[[str, str, list[str]], None]] = []
        """Called with (site, statistic, [reference, other]) when a heatmap cell is clicked."""
        self.open_runs(self.directory.value, reference=reference, other=other)

    # -- data ------------------------------------------------------------------------

    def open_runs(self, directory: str | Path, *, reference: str | None = None, other: str | None = None) -> None:
        """Open a runs folder and fill the controls from it."""
        workspace = open_workspace(directory, self.status, pairs=True)
        if workspace is None:
            return
        self.workspace, self.selected = workspace, None
        reference = reference or workspace.roles.reference
        candidates = [n for n in workspace.recorded if n != reference]
        first_other = other or next((n for n in workspace.roles.others + workspace.roles.floor_runs if n != reference),
                                    candidates[0])
        self._quiet = True
        self.reference.options, self.reference.value = workspace.recorded, reference
        self.other.options, self.other.value = workspace.recorded, first_other
        self._quiet = False
        self.update(reset_ranges=True)
        # then, in the background (after the first heatmap, so as not to slow it down): the pair's statistics and
        # the other statistics' step bins (``Workspace.read_pair_ahead``)
        workspace.read_pair_ahead(reference, first_other, [s for s in self.stat.options if s != self.stat.value])

    def _matrix(self, low: int, high: int, *, keep: bool = True) -> pd.DataFrame:
        """Site x step matrix of the current pair and statistic over steps ``low``..``high`` (the workspace holds
        the latest two, ``keep``)."""
        assert self.workspace is not None
        return self.workspace.heatmap_matrix(self.reference.value, self.other.value, self.stat.value, (low, high),
                                             keep=keep)

    def _overview(self, site: str | None) -> StepBins:
        """The step bins of the current pair and statistic: what a view of every step draws, held by the workspace,
        keeping ``site``'s series of both runs from the same read (the detail shows it next)."""
        assert self.workspace is not None
        return self.workspace.step_bins(self.reference.value, self.other.value, self.stat.value, site=site)

    def selected_sites(self, sites: list[str]) -> list[str]:
        """``sites`` passing the glob, kind and layer filters."""
        low, high = self.layers.value
        kinds = set(self.kinds.value)
        matches = site_matcher(self.site_glob.value or "*")
        chosen = []
        for site in sites:
            kind, name = split_site(site)
            layer = layer_of(name)
            inside = self.outside_layers.value if layer is None else low <= layer <= high
            if kind in kinds and inside and matches(site):
                chosen.append(site)
        return chosen

    # -- views -----------------------------------------------------------------------

    def update(self, *, reset_ranges: bool = False) -> None:
        if self._quiet or self.workspace is None or not self.reference.value or not self.other.value:
            return
        with self.workspace.foreground():  # the background's next read waits for this view
            self._update(reset_ranges)

    def _update(self, reset_ranges: bool) -> None:
        assert self.workspace is not None
        start = time.perf_counter()
        try:
            result = self.workspace.comparison(self.reference.value, self.other.value, cells=True)
        except WorkbenchError as err:
            self.status.value = f"<b>cannot compare</b>: {err}"
            return
        if reset_ranges:
            self._reset_ranges(result.common_sites, result.common_steps)
        low, high = self.steps.value
        provenance = self.workspace.provenance([result.a, result.b])
        if (low, high) == (self.steps.min, self.steps.max):  # every step: drawn from the step bins
            shown = self.selected[0] if self.selected else result.first_site  # the site the detail shows
            if shown is not None:
                self.workspace.follow_site(shown)
            bins = self._overview(shown)
            rows = self.selected_sites(list(bins.matrix.index))
            figure = divergence_heatmap(result, self.stat.value, provenance=provenance,
                                        overview=bins if len(rows) == len(bins.matrix.index) else bins.rows(rows))
        else:
            matrix = self._matrix(low, high)
            rows = self.selected_sites(list(matrix.index))
            figure = divergence_heatmap(result, self.stat.value, matrix=matrix.loc[rows],
                                        provenance=provenance)
        show(self.heatmap, figure)
        # every trace: plotly's widget may report a heatmap cell's click under another trace's index (the browser
        # test's click was never heard by the heatmap's own handler), and every trace's points are (step, site)
        for trace in self.heatmap.data:
            trace.on_click(self._on_click)
        self._list_sites(rows, result.frontier, low, high)
        verdict = ("bitwise identical" if result.identical else
                   f"first divergence at step <b>{result.first_step}</b>, site <b>{result.first_site}</b>; "
                   f"origins: {', '.join(result.origin_sites[:4])}")
        self.last_update_s = time.perf_counter() - start
        self.status.value = (f"{result.a} vs {result.b}: {verdict}. Showing {len(rows)} of "
                             f"{len(result.common_sites)} sites, steps {low}..{high} "
                             f"(updated in {1000 * self.last_update_s:.0f} ms)")
        if self.selected is None and result.first_site is not None and result.first_site in rows:
            self.show_site(result.first_site, int(result.first_step))  # type: ignore[arg-type]
        elif self.selected is not None and self.selected[0] in rows and \
                self._detail != (self.reference.value, self.other.value, self.stat.value):
            self.show_site(*self.selected)  # the clicked site, in the pair and statistic now chosen
        elif self.selected is not None and self.selected[0] not in rows and self.site_list.options:
            # the filter left the detail's site out: the detail shows the first shown site to differ instead
            site = self.site_list.options[0][1]
            self.show_site(site, self._site_steps.get(site, low))

    def _reset_ranges(self, sites: list[str], steps: list[int]) -> None:
        layers = [layer_of(split_site(s)[1]) for s in sites]
        numbered = [x for x in layers if x is not None]
        self._quiet = True
        self.layers.min, self.layers.max = 0, max(numbered, default=0)
        self.layers.value = (0, max(numbered, default=0))
        self.steps.max, self.steps.min = max(steps), min(steps)
        self.steps.value = (min(steps), max(steps))
        present = [k for k in SITE_KINDS if any(split_site(s)[0] == k for s in sites)]
        self.kinds.options, self.kinds.value = present, tuple(present)
        self._quiet = False

    def _list_sites(self, rows: list[str], frontier: pd.Series, low: int, high: int) -> None:
        """Fill the site list with the shown ``rows``: those that first differ in ``low..high``, in the order they
        do (model order within a step), then the others in model order."""
        position = {site: i for i, site in enumerate(rows)}
        first = {site: int(step) for site, step in frontier.items() if site in position and low <= step <= high}
        order = sorted(first, key=lambda site: (first[site], position[site])) + [s for s in rows if s not in first]
        self._quiet = True
        self.site_list.options = [(f"step {first[site]}: {site}" if site in first else
                                   f"equal in steps {low}..{high}: {site}", site) for site in order]
        self.site_list.value = self.selected[0] if self.selected and self.selected[0] in position else None
        self._site_steps, self._listed = first, set(order)
        self._quiet = False

    def _on_site_chosen(self, change: dict[str, Any]) -> None:
        site = change["new"]
        if self._quiet or site is None or (self.selected is not None and self.selected[0] == site):
            return
        self._show_and_tell(site, self._site_steps.get(site, self.steps.value[0]))

    def _on_click(self, trace: Any, points: Any, state: Any) -> None:
        if points.xs and points.ys:
            self._show_and_tell(str(points.ys[0]), int(points.xs[0]))

    def _show_and_tell(self, site: str, step: int) -> None:
        """Show ``site`` at ``step`` in the detail, and tell the site listeners."""
        self.show_site(site, step)
        for listener in self.site_listeners:
            listener(site, self.stat.value, [self.reference.value, self.other.value])

    def show_site(self, site: str, step: int) -> None:
        """The linked views for one heatmap cell: the site's statistic over steps, and its snapshots."""
        assert self.workspace is not None
        self.selected = (site, step)
        if self.site_list.value != site and site in self._listed:
            quiet, self._quiet = self._quiet, True
            self.site_list.value = site
            self._quiet = quiet
        a, b = self.reference.value, self.other.value
        self._detail = (a, b, self.stat.value)
        self.workspace.follow_site(site)  # its other statistics' series kept as the background reads them
        series = self.workspace.site_series(site, self.stat.value, [a, b], keep_statistic=False)
        figure = trajectory_figure(series, reference=a, quantity=self.stat.value,
                                   styles=run_styles(self.workspace.names),
                                   title=f"{self.stat.value} of {site} ({layer_label(site)}), clicked at step {step}")
        figure.add_vline(x=step, line=dict(color="#999999", dash="dot"))
        show(self.detail, figure)
        self.snapshot_view.clear_output()
        differences = self.workspace.snapshot_differences(a, b, step, [site])
        with self.snapshot_view:
            if differences:
                # displayed: a figure widget's ``show()`` only returns it, which showed nothing in an output
                snapshots = figure_widget()
                show(snapshots, elementwise_figure(differences, step=step, a=a, b=b))
                display(snapshots)
            else:
                print(f"no snapshots of {site} at step {step} in both runs "
                      "(record.snapshot_steps / record.snapshot_sites)")
        # its other statistics, for the next statistic chosen: those whose step bins are done (the background
        # keeps the clicked site's series as it computes the others' bins, from the same reads)
        binned = [s for s in self.stat.options if self.workspace.has_step_bins(a, b, s)]
        self.workspace.read_site_ahead(site, [a, b], binned)

    def figures(self) -> dict[str, go.Figure]:
        """The figures currently shown, by file name."""
        shown = {"divergence-heatmap": go.Figure(self.heatmap)}
        if self.detail.data:
            shown["site-detail"] = go.Figure(self.detail)
        return shown

    def exported(self) -> Exported | None:
        if self.workspace is None:
            return None
        low, high = self.steps.value
        matrix = self._matrix(low, high, keep=(low, high) != (self.steps.min, self.steps.max))
        return self.figures(), {"divergence-heatmap": matrix.loc[self.selected_sites(list(matrix.index))]}

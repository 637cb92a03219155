"""What every widget shares: showing a figure in place, and the export bar (figures and CSV).

    show(self.figure, pairs_figure(...))
    self.export_bar = ExportBar(lambda: ({"pair-matrix": go.Figure(self.figure)}, {"pair-matrix": matrix.table()}))
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
from collections.abc import Callable, Mapping
from copy import deepcopy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from _plotly_utils.basevalidators import is_typed_array_spec
from _plotly_utils.utils import to_typed_array_spec
from traitlets import Unicode, default, observe

from workbench.errors import WorkbenchError
from workbench.figures.style import TEMPLATE

if TYPE_CHECKING:
    from workbench.studies.workspace import Workspace

EXPORT_FORMATS = ("png", "svg", "pdf", "html")

Exported = tuple[Mapping[str, go.Figure], Mapping[str, pd.DataFrame]]
"""Figures by file name, and the plotted data by file name (written as ``<name>.csv``)."""


def open_workspace(directory: str | Path, status: widgets.HTML, *, pairs: bool = False) -> Workspace | None:
    """The folder's workspace, or None with the reason on ``status`` (with ``pairs``: two recorded runs needed). A
    run under the folder that cannot be read is left out and named on ``status``, as ``workbench ls`` names it."""
    from workbench.studies.workspace import Workspace

    skipped: list[str] = []
    try:
        workspace = Workspace.open(directory, on_skip=lambda path, err: skipped.append(f"{path.name} ({err})"))
    except WorkbenchError as err:
        status.value = f"<b>cannot open {directory}</b>: {err}"
        return None
    if pairs and len(workspace.recorded) < 2:
        status.value = f"{directory}: fewer than two runs with per-site records; nothing to compare"
        return None
    if skipped:
        status.value = html.escape(f"skipped {len(skipped)} unreadable: {'; '.join(skipped)}")
    return workspace


@functools.cache
def _plotly_module() -> tuple[str, str]:
    """plotly's widget module (as anywidget read it from its file), and a key naming its version."""
    code = str(go.FigureWidget._esm)
    return code, "workbench-plotly-widget-" + hashlib.sha256(code.encode()).hexdigest()[:16]


REPORTED_ARRAY_LIMIT = 64
"""Longest array the page reports back to the kernel among the defaults it filled in after a redraw
(``_js2py_traceDeltas``, ``_js2py_layoutDelta``); longer ones are left out. plotly.js reports a heatmap's whole
``z`` there (a 2-D typed array comes back as one list per row): for the demo's explorer, 307 sites, one message of
45 MB, over which JupyterLab's server closed the kernel's connection and no click was heard again. The kernel
reads nothing from those arrays, its own data; a click sends its point alone (``_js2py_pointsCallback``)."""


class _Loader:
    """The front-end module of our figure widgets: a few lines that evaluate plotly's widget code once per page,
    when the first view is drawn, and draw every view with it.

    anywidget gives a widget's module 2 s to load and bind; a model whose module takes longer drops every message
    the kernel sends it, then and later (anywidget 0.11, ``Runtime.ready``). plotly's 5 MB module was evaluated
    once per widget, ~1.5 s each in headless Chromium on a 2-core machine, so on a busy machine an explorer came
    up with empty axes and stayed so. This module binds at once (plotly's code travels as the ``_plotly_code``
    trait, a string); a view waits for plotly's code, which nothing times out. The model needs none of plotly's
    code meanwhile: ``show`` sends each figure whole as the state a new view draws from."""

    def __str__(self) -> str:
        return _LOADER.replace("KEY", json.dumps(_plotly_module()[1])).replace("LIMIT", str(REPORTED_ARRAY_LIMIT))


_LOADER = """const plotly = (model) => (globalThis[KEY] ??= import(URL.createObjectURL(
  new Blob([model.get("_plotly_code")], {type: "text/javascript"}))));
const small = (value) => {
  if (Array.isArray(value) || ArrayBuffer.isView(value)) return value.length <= LIMIT ? value : undefined;
  if (value === null || typeof value !== "object") return value;
  const kept = {};
  for (const [key, item] of Object.entries(value)) { const s = small(item); if (s !== undefined) kept[key] = s; }
  return kept;
};
const reports = {
  _js2py_traceDeltas: (v) => v && { ...v, trace_deltas: v.trace_deltas.map(small) },
  _js2py_layoutDelta: (v) => v && { ...v, layout_delta: small(v.layout_delta) },
};
const trimmed = (model) => {
  if (!model.__workbenchTrimmed) {
    const set = model.set.bind(model);
    model.set = (key, value, ...rest) => set(key, key in reports ? reports[key](value) : value, ...rest);
    model.__workbenchTrimmed = true;
  }
  return model;
};
export default () => ({
  async render({ model, el }) {
    const module = await plotly(model);
    const widget = typeof module.default === "function" ? await module.default() : module.default;
    await widget.initialize?.({ model: trimmed(model) });
    return widget.render({ model: trimmed(model), el });
  },
});
"""


class FigureWidget(go.FigureWidget):
    """plotly's figure widget, with its front-end code loaded once per page (``_Loader``) and the
    frontend's report of its trace defaults kept from swallowing a click.

    After each redraw the page reports the defaults it filled in (``_js2py_traceDeltas``). For a heatmap whose
    ``z`` went as a typed array, plotly's handler fails on that report (``_remove_overlapping_props`` asserts a
    dict where the page sends one per row). The failure alone is harmless, but when the kernel is busy the
    page sends a click in the same message as the report, and traitlets stops delivering that message's
    changes at the first handler that raises: the click was never heard (1 in 2 clicks, the machine busy).
    The report only tells the kernel defaults it does not use, so a failure to read it is dropped."""

    _esm = _Loader()
    _plotly_code = Unicode().tag(sync=True)

    @default("_plotly_code")
    def _plotly_code_default(self) -> str:  # read as the widget opens: in the state its page first gets
        return _plotly_module()[0]

    @observe("_js2py_traceDeltas")
    def _handler_js2py_traceDeltas(self, change: dict[str, Any]) -> None:
        try:
            super()._handler_js2py_traceDeltas(change)
        except Exception:  # plotly's own fault, whatever it is: the message's click comes next
            self._js2py_traceDeltas = None


def figure_widget() -> FigureWidget:
    """An empty figure widget in the figures' own template: with plotly's default one, making it copies that
    template's defaults for every trace type (~0.15 s the first time in a kernel)."""
    return FigureWidget(layout=dict(template=TEMPLATE))


LIST_ROWS = 16
"""Most rows a selection list shows; a longer one scrolls."""


def fill_list(control: widgets.SelectMultiple, options: list[str]) -> None:
    """Give the list ``options`` and rows for all of them (up to ``LIST_ROWS``): what is selected is seen."""
    control.options = options
    control.rows = max(2, min(len(options), LIST_ROWS))


def show(target: go.FigureWidget, figure: go.Figure) -> None:
    """Replace what ``target`` shows with ``figure`` in one update. Numeric data goes as binary arrays, with
    NaN for gaps (infinities too): as JSON, which has neither NaN nor infinities, a 600 x 400 heatmap's
    nested lists take ~0.1 s to walk before they are sent, and a gap must be spelled ``null``."""
    for trace in figure.data:
        for name in ("x", "y", "z"):
            values = getattr(trace, name, None)
            if values is None or is_typed_array_spec(values):
                continue
            array = np.asarray(values)
            numeric = array.dtype.kind == "f" or array.dtype.kind in "iu" and array.ndim == 2
            if not numeric or array.ndim not in (1, 2):  # strings, dates; 1-D integers go as JSON numbers
                continue
            array = array.astype(np.float64)  # a copy: the caller's array is not changed (``figure``'s trace is)
            array[~np.isfinite(array)] = np.nan
            # 1-D float arrays travel as binary buffers; 2-D ones as plotly.js's typed-array spec
            setattr(trace, name, array if array.ndim == 1 else to_typed_array_spec(array))
    with target.batch_update():
        target.data = ()
        target.layout = figure.layout
        target.add_traces(figure.data)
    # the whole figure also as the state a page draws a new view from: messages that arrive while no view is
    # drawn reach no plotly code (_Loader)
    target._widget_layout = deepcopy(target._layout_obj._props)
    target._widget_data = deepcopy(target._data)


class ExportBar(widgets.HBox):
    """Folder, formats and a button that writes what ``exported()`` returns; says what it wrote beside the button
    (``status``, its own line: the widget's status line sits above the figures, off screen from the button)."""

    def __init__(self, exported: Callable[[], Exported | None]) -> None:
        super().__init__()
        self.status = widgets.HTML()
        self.exported = exported
        # relative to the notebook: notebooks/figures/ in this repository, which git ignores
        self.folder = widgets.Text(value="figures", description="export to", style={"description_width": "initial"})
        self.formats = widgets.SelectMultiple(options=list(EXPORT_FORMATS), value=("png", "html"), rows=4,
                                              description="formats", style={"description_width": "initial"})
        self.button = widgets.Button(description="export figures and CSV", icon="download",
                                     layout=widgets.Layout(width="auto"))  # its default width cuts the words
        self.button.on_click(lambda _: self.export())
        self.children = [self.folder, self.formats, widgets.VBox([self.button, self.status])]

    def export(self) -> list[Path]:
        """Write the figures in the chosen formats and the data as CSV; the paths written."""
        from workbench.figures.export import export_figures

        content = self.exported()
        if content is None:
            self.status.value = "nothing to export yet"
            return []
        figures, tables = content
        try:
            written = export_figures(dict(figures), self.folder.value, self.formats.value)
        except WorkbenchError as err:
            self.status.value = f"<b>export failed</b>: {err}"
            return []
        for name, table in tables.items():
            path = Path(self.folder.value) / f"{name}.csv"
            table.to_csv(path, index=not isinstance(table.index, pd.RangeIndex))
            written.append(path)
        self.status.value = f"wrote {len(written)} files to {Path(self.folder.value).resolve()}"
        return written


class WorkbenchWidget(widgets.VBox):
    """What the widgets share: the CSS class the browser test and user CSS find (``css_class``), the workspace, a
    status line, an export bar over what ``exported`` returns, and the quiet pattern: while ``_quiet`` (from
    construction until ``watch``), changing a control draws nothing, so that a widget fills its controls from a
    folder of runs and draws once."""

    css_class = "workbench-widget"

    def __init__(self) -> None:
        super().__init__()
        self.add_class(self.css_class)
        self.workspace: Workspace | None = None
        self.status = widgets.HTML()
        self.export_bar = ExportBar(self.exported)
        self._quiet = True

    def watch(self, *controls: widgets.Widget) -> None:
        """Draw again whenever one of ``controls`` changes; from now on ``update`` draws."""
        for control in controls:
            control.observe(lambda _: self.update(), names="value")
        self._quiet = False

    def update(self) -> None:
        """Draw what the controls say (each widget its own)."""

    def exported(self) -> Exported | None:
        """The figures and tables the export bar writes; None before anything is drawn."""
        return None

    def export(self) -> list[Path]:
        """Write the figures shown and their data (``ExportBar.export``)."""
        return self.export_bar.export()

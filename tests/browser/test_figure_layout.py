"""Every figure, at every export size, laid out by plotly.js in Chromium: no two labels overlap, none leaves the
figure.

The figures are the report's (the loss of every run, each pair's heatmap, growth and element-wise figures, the
ladder, the cost) and the other views a researcher exports (the pair matrix, a site's trajectory as the
explorer's detail draws it), on the mini demo's runs, at the size a screen export has and at the paper sizes
(``for_paper``: "column", "page"). The boxes compared are those the browser lays out: the title, the legend,
each axis title, each tick label, each annotation (the provenance footer among them) and each colour bar. Two
tick labels of one axis are not compared with each other (plotly spaces them), nor an annotation with the plot
it marks; every other pair must not overlap by more than a pixel, and every box must lie inside the figure.
The same plotly.js lays out a static export (kaleido drives the same kind of browser), so what passes here is
what a PDF shows.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path
from typing import Any

import plotly
import plotly.graph_objects as go
import pytest

CHROMIUM = os.environ.get("BROWSER_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium, or BROWSER_PATH)")

SIZES = ("screen", "column", "page")
KALEIDO_DEFAULT = (700, 500)
"""The width and height a static export gives a figure that sets none (kaleido's defaults)."""
SLACK_PX = 1.0
"""How far two boxes may overlap, or a box leave the figure, before it counts (antialiased edges)."""

BOXES_JS = """
(gd) => {
  const out = [];
  const add = (group, el) => {
    const r = el.getBoundingClientRect();
    if (r.width > 0.5 && r.height > 0.5 && (el.textContent || '').trim() !== '' || group.startsWith('legend')
        || group.startsWith('colorbar')) {
      if (r.width > 0.5 && r.height > 0.5)
        out.push({group, text: (el.textContent || '').slice(0, 60), x0: r.left, y0: r.top, x1: r.right, y1: r.bottom});
    }
  };
  gd.querySelectorAll('.g-gtitle text.gtitle').forEach(el => add('title', el));
  gd.querySelectorAll('g.legend').forEach((el, i) => add('legend' + i, el.querySelector('rect.bg') || el));
  gd.querySelectorAll('text').forEach(el => {
    const cls = el.getAttribute('class') || '';
    if (/^[xy][0-9]*title$/.test(cls)) add('axis title ' + cls, el);
  });
  gd.querySelectorAll('g.xtick > text, g.ytick > text, g.xtick text, g.ytick text').forEach(el => {
    const tick = el.closest('g.xtick, g.ytick');
    const layer = el.closest('g[class*="axislayer"]');
    const subplot = el.closest('g.subplot');
    add('ticks ' + (subplot ? subplot.getAttribute('class') : '') + ' ' + (layer ? layer.getAttribute('class') : '')
        + ' ' + tick.getAttribute('class'), el);
  });
  gd.querySelectorAll('g.annotation').forEach(el => add('annotation ' + el.getAttribute('data-index'),
                                                        el.querySelector('g.annotation-text-g') || el));
  gd.querySelectorAll('g.colorbar').forEach((el, i) => add('colorbar' + i, el));
  // a legend taller than its room is cut (or scrolls): an entry below the bottom of its background is hidden
  gd.querySelectorAll('g.legend').forEach(legend => {
    const bg = legend.querySelector('rect.bg');
    if (!bg) return;
    const bottom = bg.getBoundingClientRect().bottom;
    legend.querySelectorAll('g.traces').forEach(el => {
      const r = el.getBoundingClientRect();
      if (r.height > 0.5 && r.top > bottom - 1) out.push({group: 'legend hidden entry', text: el.textContent || '',
                                                          x0: r.left, y0: r.top, x1: r.right, y1: r.bottom}); }); });
  const r = gd.getBoundingClientRect();
  return {boxes: out, x0: r.left, y0: r.top};
}
"""


def _figures(runs: Path) -> Iterator[tuple[str, go.Figure]]:
    from workbench.studies import views
    from workbench.studies.report import report_figures
    from workbench.studies.workspace import Workspace

    ws = Workspace.open(runs)
    yield from report_figures(ws).items()
    yield "pairs", views.pairs(ws).figure
    yield "trajectories-grad_norm", views.trajectories(ws, "grad_norm").figure
    result = ws.comparison("nondet-r0", "nondet-r1")
    site = result.first_site
    assert site is not None
    yield "site-detail", views.trajectories(ws, "l2", ["nondet-r0", "nondet-r1"], site=site,
                                            title=f"l2 of {site}, clicked at step {result.first_step}").figure


def _sized(figure: go.Figure, size: str) -> go.Figure:
    from workbench.figures.style import for_paper

    return figure if size == "screen" else for_paper(figure, size)


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    script = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1600})
            page.set_content("<html><body style='margin:0'><div id='fig'></div></body></html>")
            page.add_script_tag(path=str(script))
            yield page
        finally:
            browser.close()


def _laid_out(page: Any, figure: go.Figure) -> tuple[list[dict[str, Any]], float, float]:
    spec = json.loads(figure.to_json())
    layout = spec.get("layout", {})
    width, height = layout.get("width") or KALEIDO_DEFAULT[0], layout.get("height") or KALEIDO_DEFAULT[1]
    layout.update(width=width, height=height)
    found = page.evaluate("async ([data, layout]) => { const gd = document.getElementById('fig'); "
                          "Plotly.purge(gd); await Plotly.newPlot(gd, data, layout, {staticPlot: true}); "
                          "return (" + BOXES_JS + ")(gd); }", [spec.get("data", []), layout])
    boxes = [dict(b, x0=b["x0"] - found["x0"], x1=b["x1"] - found["x0"], y0=b["y0"] - found["y0"],
                  y1=b["y1"] - found["y0"]) for b in found["boxes"]]
    return boxes, float(width), float(height)


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> float:
    return min(min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]), min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]))


def _same_axis_ticks(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["group"].startswith("ticks") and b["group"].startswith("ticks") and \
        a["group"].rsplit(" ", 1)[0] == b["group"].rsplit(" ", 1)[0]


def layout_faults(boxes: list[dict[str, Any]], width: float, height: float) -> list[str]:
    """What is wrong with one laid-out figure: boxes that leave it, pairs of boxes that overlap."""
    faults = [f"{b['group']} {b['text']!r} leaves the figure ({b['x0']:.0f}, {b['y0']:.0f})-({b['x1']:.0f}, "
              f"{b['y1']:.0f}) of {width:.0f} x {height:.0f}"
              for b in boxes if b["x0"] < -SLACK_PX or b["y0"] < -SLACK_PX or b["x1"] > width + SLACK_PX
              or b["y1"] > height + SLACK_PX]
    faults += [f"legend entry {b['text']!r} hidden: the legend is cut" for b in boxes
               if b["group"] == "legend hidden entry"]
    boxes = [b for b in boxes if b["group"] != "legend hidden entry"]
    for a, b in combinations(boxes, 2):
        if a["group"] == b["group"] or _same_axis_ticks(a, b):
            continue
        if _overlap(a, b) > SLACK_PX:
            faults.append(f"{a['group']} {a['text']!r} overlaps {b['group']} {b['text']!r}")
    return faults


def test_the_checker_finds_a_label_over_the_footer_and_one_outside(page: Any) -> None:
    from workbench.figures.style import apply_style
    from workbench.store.manifest import Provenance

    figure = apply_style(go.Figure(go.Scatter(x=[0, 1], y=[0, 1], name="a")), title="t", width=400, height=300,
                         provenance=Provenance(runs=("a", "b"), configs=("fp32 tp1",), schema_version=3,
                                               revision="0" * 40))
    figure.add_annotation(text="over the footer", xref="paper", yref="paper", x=0, y=0, yshift=-80,
                          showarrow=False, xanchor="left", yanchor="bottom")
    figure.add_annotation(text="outside", xref="paper", yref="paper", x=1.3, y=0.5, showarrow=False)
    faults = layout_faults(*_laid_out(page, figure))
    assert any("over the footer" in f and "overlaps" in f for f in faults), faults
    assert any("'outside' leaves the figure" in f for f in faults), faults


def test_a_legend_of_sixteen_runs_is_shown_whole(page: Any) -> None:
    # the report's loss of the demo's 13 runs: each run its own legend group, whose gaps made the legend scroll
    import numpy as np
    import pandas as pd

    from workbench.figures.trajectories import trajectory_figure

    steps = pd.RangeIndex(60, name="step")
    series = {f"run-{i}": pd.Series(np.linspace(5, 2, 60) + 0.01 * i, index=steps) for i in range(16)}
    spread = (series["run-0"] - 0.1, series["run-0"] + 0.1)
    figure = trajectory_figure(series, reference="run-0", floor=spread, seed_spread=spread, title="loss of every run")
    faults = layout_faults(*_laid_out(page, figure))
    assert not faults, faults
    plain = go.Figure(figure).update_layout(legend=dict(tracegroupgap=10))  # plotly's gap: the checker sees it
    assert any("hidden: the legend is cut" in f for f in layout_faults(*_laid_out(page, plain)))


def test_no_label_overlaps_another_or_leaves_the_figure(page: Any, mini_demo: Path) -> None:
    faults = []
    checked = 0
    for name, figure in _figures(mini_demo):
        for size in SIZES:
            found = layout_faults(*_laid_out(page, _sized(figure, size)))
            faults += [f"{name} ({size}): {fault}" for fault in found]
            checked += 1
    print(f"{checked} figure layouts checked")
    assert not faults, "\n".join(faults)

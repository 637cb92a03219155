"""The report's page: each table once, tables and text that wrap instead of scrolling, figures two to a page."""

from __future__ import annotations

import html
from dataclasses import replace
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.cost import COLUMNS as COST_COLUMNS
from workbench.store import synthetic
from workbench.store.synthetic import STEP_SCALARS as SCALARS
from workbench.store.writer import ScalarWriter
from workbench.studies.report import (
    _STYLE,
    PRINT_FULL_PAGE,
    PRINT_HALF_PAGE,
    PRINT_WIDTH,
    _for_print,
    _page,
    _table,
    report_figures,
)
from workbench.studies.summary import summarise
from workbench.studies.workspace import Workspace

A4_CONTENT_HEIGHT = 1032
"""CSS pixels down A4 (297 mm) less the report's 12 mm margins."""


def _workspace(tmp_path: Path) -> Workspace:
    synthetic.write_synthetic_run(tmp_path / "a", steps=20, sites=6)
    synthetic.write_synthetic_run(tmp_path / "b", steps=20, sites=6, seed=1)
    writer = ScalarWriter(tmp_path / "b", flush_every=1)
    writer.append(12, {**SCALARS, "loss": float("nan")})  # an anomaly, for the anomaly table
    writer.close()
    return Workspace.open(tmp_path)


def test_the_runs_table_is_shown_once_and_nothing_is_preformatted_but_the_manifests(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    cost = pd.DataFrame([["L2 H64 TP1-PP1-DP1 fp32", 100.0, 110.0, 10.0, 5.0, 15.0, 20, 20]], columns=COST_COLUMNS)
    summary = replace(summarise(ws), cost=cost)  # synthetic runs are all repeats: no ladder, no scales
    assert len(summary.tables()) == 1
    page = _page(summary, ws, {}, "")
    assert "<h2>Summary</h2>" not in page and page.count(">run_<wbr>id</th>") == 1
    for table in summary.tables():  # every table of the summary, under its heading, as in `workbench summary`
        assert html.escape(table.heading[1:]) in page and f"{table.heading}:" in summary.text()
    body = page[page.index("<body>"):page.index("<h2>Manifests</h2>")]
    assert "<pre>" not in body and body.count('class="dataframe data"') == 1 + len(summary.tables()) + 1
    style = page[page.index("<style>"):page.index("</style>")]
    assert "overflow-x" not in style and "overflow: auto" not in style and "scroll" not in style  # no printed bars
    assert "white-space: pre-wrap" in style and "@page { size: A4" in style
    manifests = len(ws.runs)  # collapsed on screen; open on paper, which cannot be clicked
    assert page.count("<details>") == manifests and _page(summary, ws, {}, "", printed=True).count(
        "<details open>") == manifests


def test_a_table_breaks_names_after_dots_and_underscores_but_keeps_numbers_whole() -> None:
    frame = pd.DataFrame({"leaves_floor_at": [3], "first_site": ["grad:embedding.word_embeddings.weight"],
                          "final_rel_l2": [1.5e-3]})
    table = _table(frame, floats=lambda x: f"{x:.2e}")
    assert ">leaves_<wbr>floor_<wbr>at</th>" in table
    assert ">grad:embedding.<wbr>word_<wbr>embeddings.<wbr>weight</td>" in table
    # on one line: a browser may break a line after the exponent's hyphen ("8.56e-" / "01")
    assert '><span class="num">1.50e-03</span></td>' in table and 'class="dataframe data"' in table
    assert "span.num { white-space: nowrap; }" in _STYLE


def test_figures_are_printed_the_page_wide_and_two_to_a_page(tmp_path: Path) -> None:
    figures = report_figures(_workspace(tmp_path))
    assert len(figures) >= 2
    for name, fig in figures.items():
        printed = _for_print(fig)
        assert printed.layout.width == max(fig.layout.width or 0, PRINT_WIDTH), name
        assert printed.layout.height <= PRINT_HALF_PAGE, name  # none of these needs more
        assert fig.layout.height != printed.layout.height or fig.layout.height <= PRINT_HALF_PAGE  # a copy
    assert 2 * PRINT_HALF_PAGE + 40 <= A4_CONTENT_HEIGHT  # two, and the gaps between them, fit
    tall = go.Figure(layout=dict(height=900))  # a heatmap of many layers keeps the height its labels need
    assert _for_print(tall).layout.height == 900 and _for_print(go.Figure(layout=dict(height=2000))).layout.height \
        == PRINT_FULL_PAGE

"""The pair matrix: every pair's first divergent step, identical runs grouped; its figure and widget."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from workbench.errors import ArgumentError
from workbench.figures.pairs import pairs_figure
from workbench.store import layout
from workbench.store.synthetic import write_synthetic_run
from workbench.studies.workspace import Workspace


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    write_synthetic_run(root / "b-same", steps=12, sites=20)
    write_synthetic_run(root / "a-base", steps=12, sites=20)
    write_synthetic_run(root / "c-late", steps=12, sites=20, diverge_at=(7, 4))
    write_synthetic_run(root / "d-early", steps=12, sites=20, diverge_at=(3, 0))
    write_synthetic_run(root / "e-early-too", steps=12, sites=20, diverge_at=(3, 0))
    return root


def test_every_pair_has_its_first_divergent_step_and_identical_runs_are_grouped(folder: Path) -> None:
    ws = Workspace.open(folder)
    matrix = ws.pair_matrix()
    assert matrix.groups == [["a-base", "b-same"], ["d-early", "e-early-too"]]
    assert matrix.names == ["a-base", "b-same", "c-late", "d-early", "e-early-too"]  # groups adjacent
    steps = matrix.first_step
    assert steps.loc["a-base", "c-late"] == 7 and steps.loc["c-late", "a-base"] == 7
    assert steps.loc["b-same", "d-early"] == 3 and steps.loc["c-late", "d-early"] == 3
    assert pd.isna(steps.loc["a-base", "b-same"]) and pd.isna(steps.loc["c-late", "c-late"])
    assert matrix.identical.loc["d-early", "e-early-too"] and not matrix.identical.loc["a-base", "c-late"]
    for a, b in [("a-base", "c-late"), ("b-same", "d-early")]:
        assert steps.loc[a, b] == ws.comparison(a, b).first_step
    table = matrix.table()
    assert len(table) == 10 and set(table["verdict"]) == {"identical", "differ"}
    with pytest.raises(ArgumentError, match="two or more runs"):
        ws.pair_matrix(["a-base"])


def test_the_figure_marks_identical_cells_and_outlines_each_group(folder: Path) -> None:
    matrix = Workspace.open(folder).pair_matrix()
    fig = pairs_figure(matrix)
    steps = fig.data[1]
    text = np.asarray(steps.text)
    assert text[0, 1] == "=" and text[0, 2] == "7" and text[3, 0] == "3"
    assert list(steps.customdata[0][2]) == ["a-base", "c-late"]
    assert len(fig.layout.shapes) == 2


def test_clicking_a_cell_opens_that_pair_in_the_explorer(folder: Path, tmp_path: Path) -> None:
    from workbench.widgets.pairs import PairMatrixWidget

    widget = PairMatrixWidget(folder)
    assert "2 groups of bitwise identical runs" in widget.status.value
    widget._on_click(None, SimpleNamespace(xs=["c-late"], ys=["a-base"]), None)
    explorer = widget.explorer
    assert explorer is not None and (explorer.reference.value, explorer.other.value) == ("a-base", "c-late")
    assert "first divergence at step <b>7</b>" in explorer.status.value
    widget._on_click(None, SimpleNamespace(xs=["d-early"], ys=["b-same"]), None)
    assert widget.explorer is explorer and explorer.other.value == "d-early"
    widget.export_bar.folder.value, widget.export_bar.formats.value = str(tmp_path), ("html",)
    written = widget.export()
    assert sorted(p.name for p in written) == ["pair-matrix.csv", "pair-matrix.html"]
    assert len(pd.read_csv(tmp_path / "pair-matrix.csv")) == 10
    bad = PairMatrixWidget(tmp_path / "absent")
    assert "cannot open" in bad.status.value


def test_a_paper_sized_figure_has_print_fonts_no_title_and_the_footer_wrapped(folder: Path) -> None:
    from workbench.figures.style import PAPER_WIDTHS_IN, PX_PER_IN, for_paper

    ws = Workspace.open(folder)
    fig = pairs_figure(ws.pair_matrix(), provenance=ws.provenance())
    for size, points in (("column", 7.0), ("page", 8.0)):
        paper = for_paper(fig, size)
        assert paper.layout.width == round(PAPER_WIDTHS_IN[size] * PX_PER_IN)
        assert paper.layout.font.size == round(points * PX_PER_IN / 72, 1)
        assert paper.layout.title.text is None
        footer = next(a for a in paper.layout.annotations if a.name == "provenance")
        assert f"schema v{layout.SCHEMA_VERSION}" in footer.text and "<br>" in footer.text
    assert fig.layout.width != for_paper(fig, "column").layout.width  # a copy: the original is unchanged
    with pytest.raises(ArgumentError, match="one of column, page"):
        for_paper(fig, "poster")


def test_the_figure_verb_writes_one_figure_and_its_data(folder: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.cli import main as cli
    from workbench.figures.export import static_export_available

    out = tmp_path / "figs"
    assert cli(["figure", "pairs", str(folder), "-o", str(out / "pairs.html"), "--size", "column",
                "--data", str(out / "pairs.csv")]) == 0
    assert (out / "pairs.html").stat().st_size > 0 and len(pd.read_csv(out / "pairs.csv")) == 10
    assert cli(["figure", "heatmap", str(folder / "a-base"), str(folder / "c-late"), "-o", str(out / "h.html"),
                "--data", str(out / "h.csv")]) == 0
    assert pd.read_csv(out / "h.csv", index_col=0).shape[0] == 20  # one row per site
    assert cli(["figure", "trajectories", str(folder), "-o", str(out / "loss.html")]) == 0
    assert cli(["figure", "heatmap", str(folder / "a-base"), "-o", str(out / "x.html")]) == 2
    assert cli(["figure", "pairs", str(folder), "-o", str(out / "x.jpg")]) == 2
    assert "two runs" in capsys.readouterr().err
    if static_export_available() is not None:  # the static formats need a browser
        assert cli(["figure", "pairs", str(folder), "-o", str(out / "pairs.pdf"), "--size", "page"]) == 0
        assert (out / "pairs.pdf").read_bytes().startswith(b"%PDF")


def test_a_widget_figure_never_carries_nan_over_the_json_protocol(folder: Path) -> None:
    import json

    from workbench.widgets.pairs import PairMatrixWidget

    widget = PairMatrixWidget(folder)  # its first divergent steps are NaN where runs are identical
    for trace in widget.figure.data:
        json.dumps(trace.to_plotly_json(), allow_nan=False, default=lambda v: v.tolist())

"""The precision / layout widget, driven as a user would: reference, runs, statistic, layers; a click on a
layer opens that layer's sites in the explorer."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from workbench.sites import layer_label
from workbench.store.synthetic import write_synthetic_run
from workbench.widgets.ladder import LadderWidget


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ladder")
    write_synthetic_run(root / "base", steps=10, sites=60)
    write_synthetic_run(root / "layout", steps=10, sites=60, diverge_at=(2, 0), initial_difference=1e-5)
    write_synthetic_run(root / "precision", steps=10, sites=60, diverge_at=(0, 0), initial_difference=1e-3)
    return root


def layer_points(widget: LadderWidget) -> dict[str, list[str]]:
    return {t.name: list(t.x) for t in widget.figure.data if t.xaxis in (None, "x") and t.name in widget.runs.value}


def test_controls_change_the_ladder(folder: Path, tmp_path: Path) -> None:
    widget = LadderWidget(folder, runs=["layout", "precision"])
    assert widget.reference.value == "base"
    points = layer_points(widget)
    assert set(points) == {"layout", "precision"}
    first_y = {t.name: list(t.y) for t in widget.figure.data if t.name == "precision"}
    widget.stat.value = "count"  # the same in every run: no difference to show
    assert widget.ladder is not None and widget.ladder.stat == "count"
    assert {t.name: list(t.y) for t in widget.figure.data if t.name == "precision"} != first_y
    numbered = [lb for lb in points["layout"] if lb.startswith("L")]
    widget.layers.value = (0, 0)
    widget.outside_layers.value = False
    assert set(layer_points(widget)["layout"]) == {"L0"}
    widget.runs.value = ("precision",)
    assert set(layer_points(widget)) == {"precision"}
    widget.reference.value = "layout"
    assert widget.ladder.reference == "layout"
    assert len(numbered) > 1
    widget.export_bar.folder.value, widget.export_bar.formats.value = str(tmp_path), ("html",)
    assert sorted(p.name for p in widget.export()) == ["ladder.csv", "ladder.html"]
    assert set(pd.read_csv(tmp_path / "ladder.csv")["layer"]) == {"L0"}


def test_clicking_a_layer_opens_its_sites_in_the_explorer(folder: Path) -> None:
    widget = LadderWidget(folder, runs=["layout"])
    trace = next(t for t in widget.figure.data if t.name == "layout")
    widget._on_click(trace, SimpleNamespace(xs=["L1"], ys=[1e-5]), None)
    explorer = widget.explorer
    assert explorer is not None and (explorer.reference.value, explorer.other.value) == ("base", "layout")
    shown = explorer.selected_sites(list(explorer._matrix(*explorer.steps.value).index))
    assert shown and {layer_label(s) for s in shown} == {"L1"}
    widget._on_click(trace, SimpleNamespace(xs=["L0"], ys=[1e-5]), None)
    assert widget.explorer is explorer
    shown = explorer.selected_sites(list(explorer._matrix(*explorer.steps.value).index))
    assert {layer_label(s) for s in shown} == {"L0"}
    # the triangle where a run leaves the noise floor opens its layer too: the run is its legend group
    triangle = SimpleNamespace(name="layout leaves the noise floor", legendgroup="layout")
    widget._on_click(triangle, SimpleNamespace(xs=["L1"], ys=[1e-5]), None)
    assert explorer.other.value == "layout"
    shown = explorer.selected_sites(list(explorer._matrix(*explorer.steps.value).index))
    assert {layer_label(s) for s in shown} == {"L1"}

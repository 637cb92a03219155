"""The trajectory widget, driven as a user would: change a control, the figure's data follows."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from workbench.store.synthetic import write_synthetic_run
from workbench.widgets.explorer import DivergenceExplorer
from workbench.widgets.trajectories import SITE_STATISTIC, TrajectoryWidget


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trajectories")
    write_synthetic_run(root / "base", steps=10, sites=12)
    write_synthetic_run(root / "late", steps=10, sites=12, diverge_at=(6, 3))
    write_synthetic_run(root / "early", steps=10, sites=12, diverge_at=(2, 0), initial_difference=1e-3)
    return root


def lines(widget: TrajectoryWidget) -> dict[str, list[float]]:
    """The upper panel's curves, by run."""
    return {t.name: list(t.y) for t in widget.figure.data if t.yaxis in (None, "y") and t.name in widget.runs.value}


def test_controls_change_what_is_plotted(folder: Path, tmp_path: Path) -> None:
    widget = TrajectoryWidget(folder, runs=["base", "early"])
    assert set(lines(widget)) == {"base", "early"} and widget.reference.value == "base"
    assert widget.runs.rows == 3  # every run in sight, the selected ones among them
    widget.runs.value = ("base", "early", "late")
    assert set(lines(widget)) == {"base", "early", "late"}
    widget.quantity.value = SITE_STATISTIC
    widget.site.value = "grad:layers.0.mlp.linear_fc1.weight" if "grad:layers.0.mlp.linear_fc1.weight" in \
        widget.site.options else widget.site.options[0]
    site_curves = lines(widget)
    assert not [t for t in widget.figure.data if "noise floor" in str(t.name)]  # no repeats here: no band
    expected = widget.workspace.site_series(widget.site.value, "l2", ["early"])["early"]  # type: ignore[union-attr]
    assert np.allclose(site_curves["early"], expected.to_numpy())
    widget.stat.value = "max"
    assert lines(widget)["early"] != site_curves["early"]
    widget.steps.value = (3, 7)
    assert all(list(t.x) == [3, 4, 5, 6, 7] for t in widget.figure.data if t.name in widget.runs.value)
    assert widget.difference.value == "|difference|" and widget.figure.layout.yaxis2.type == "log"  # the default
    assert widget.figure.layout.yaxis2.title.text == "|minus base|"
    widget.difference.value = "relative"
    assert widget.figure.layout.yaxis2.title.text == "relative to base" and widget.figure.layout.yaxis2.type == "linear"
    widget.log_y.value = True
    assert widget.figure.layout.yaxis.type == "log"
    widget.export_bar.folder.value, widget.export_bar.formats.value = str(tmp_path), ("html",)
    written = widget.export()
    assert sorted(p.name for p in written) == ["trajectories.csv", "trajectories.html"]
    assert list(pd.read_csv(tmp_path / "trajectories.csv", index_col="step").index) == [3, 4, 5, 6, 7]


def test_a_click_in_the_explorer_opens_that_site_here(folder: Path) -> None:
    explorer = DivergenceExplorer(folder, reference="base", other="early")
    widget = TrajectoryWidget(folder)
    widget.follow(explorer)
    site = explorer.workspace.comparison("base", "early").first_site  # type: ignore[union-attr]
    explorer._on_click(None, SimpleNamespace(xs=[2], ys=[site]), None)
    assert widget.quantity.value == SITE_STATISTIC and widget.site.value == site
    assert widget.runs.value == ("base", "early") and widget.reference.value == "base"
    assert f"of {site}" in widget.status.value


def test_the_explorer_exports_its_figures_and_the_heatmap_data(folder: Path, tmp_path: Path) -> None:
    explorer = DivergenceExplorer(folder, reference="base", other="late")
    explorer.export_bar.folder.value, explorer.export_bar.formats.value = str(tmp_path), ("html",)
    names = sorted(p.name for p in explorer.export())
    assert names == ["divergence-heatmap.csv", "divergence-heatmap.html", "site-detail.html"]
    data = pd.read_csv(tmp_path / "divergence-heatmap.csv", index_col=0)
    assert data.shape[0] == 12 and "wrote 3 files" in explorer.export_bar.status.value  # one row per site


def test_a_folder_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    widget = TrajectoryWidget(tmp_path / "absent")
    assert "cannot open" in widget.status.value


def test_the_explorer_detail_follows_the_statistic_for_the_clicked_site(folder: Path) -> None:
    explorer = DivergenceExplorer(folder, reference="base", other="early")
    site = explorer.workspace.records("base").sites[5]  # type: ignore[union-attr]
    explorer._on_click(None, SimpleNamespace(xs=[4], ys=[site]), None)
    assert explorer.detail.layout.title.text.startswith(f"l2 of {site}")
    explorer.stat.value = "max"
    assert explorer.detail.layout.title.text.startswith(f"max of {site}") and explorer.selected == (site, 4)
    expected = explorer.workspace.site_series(site, "max", ["early"])["early"]  # type: ignore[union-attr]
    curve = next(t for t in explorer.detail.data if t.name == "early" and t.yaxis in (None, "y"))
    np.testing.assert_array_equal(np.asarray(curve.y, dtype=float), expected.to_numpy())

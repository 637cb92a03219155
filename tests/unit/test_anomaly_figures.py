"""Anomalies marked on trajectory figures: markers on the right curve at the right steps, no NaN."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from workbench.analysis.anomalies import COLUMNS, find_anomalies
from workbench.figures.anomaly_marks import SYMBOLS, mark_anomalies
from workbench.figures.style import PALETTE
from workbench.figures.trajectories import trajectory_figure

STEPS = pd.RangeIndex(20, name="step")


def _nan_paths(value: Any, path: str = "") -> list[str]:
    """Where a figure's JSON would hold NaN or Inf (the widget protocol rejects them)."""
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in _nan_paths(item, f"{path}.{key}")]
    if isinstance(value, list | tuple):
        return [p for i, item in enumerate(value) for p in _nan_paths(item, f"{path}[{i}]")]
    if isinstance(value, np.ndarray):
        return [path] if value.dtype.kind == "f" and not np.isfinite(value).all() else []
    if isinstance(value, float) and not math.isfinite(value):
        return [path]
    return []


def _markers(fig: go.Figure) -> dict[str, Any]:
    return {t.name.removeprefix("anomaly: "): t for t in fig.data if (t.name or "").startswith("anomaly: ")}


def _table(rows: list[tuple[str, int, str, str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame([[run, step, rule, site, value, threshold, f"{rule} detail"]
                         for run, step, rule, site, value, threshold in rows], columns=["run", *COLUMNS])


def test_markers_sit_on_their_runs_curves_with_hover_and_a_line_at_the_first_nan() -> None:
    a = pd.Series(np.linspace(5, 2, 20), index=STEPS)
    b = pd.Series(np.linspace(5, 2, 20) + 0.5, index=STEPS)
    b.loc[12:] = np.nan  # b's loss is NaN from step 12: a gap in its curve
    found = _table([("a", 5, "loss_spike", "scalar:loss", 4.2, 3.9),
                    ("b", 7, "grad_explode", "scalar:grad_norm", 50.0, 10.0),
                    ("b", 12, "nonfinite", "scalar:loss", float("nan"), 0.0)])
    fig = trajectory_figure({"a": a, "b": b}, reference="a", anomalies=found)
    markers = _markers(fig)
    assert set(markers) == {"loss_spike", "grad_explode", "nonfinite"}  # one trace per rule
    spike, explode, nonfinite = markers["loss_spike"], markers["grad_explode"], markers["nonfinite"]
    assert spike.x == (5,) and spike.y == pytest.approx((a.loc[5],)) and spike.marker.color == (PALETTE[0],)
    assert explode.x == (7,) and explode.y == pytest.approx((b.loc[7],)) and explode.marker.color == (PALETTE[1],)
    assert nonfinite.x == (12,) and nonfinite.y == pytest.approx((b.max(),))  # no curve value: the panel's top
    assert [m.marker.symbol for m in (spike, explode, nonfinite)] == [SYMBOLS["loss_spike"], "star", "x"]
    assert all(m.yaxis == "y" for m in markers.values())  # the upper panel, not the difference panel
    hover = explode.text[0]
    for part in ("b: step 7", "grad_explode", "scalar:grad_norm", "value 50", "threshold 10"):
        assert part in hover, (part, hover)
    assert "value nan" in nonfinite.text[0]
    lines = [s for s in fig.layout.shapes if s.line.dash == "dot"]
    assert {s.x0 for s in lines} == {12}
    assert any(a.text == "first NaN/Inf (b)" for a in fig.layout.annotations)
    assert _nan_paths(fig.to_plotly_json()) == []


def test_found_anomalies_on_a_single_curve_of_a_plain_figure() -> None:
    loss = pd.Series(3.0 - 0.01 * np.arange(40) + 0.01 * np.random.default_rng(0).standard_normal(40),
                     index=pd.RangeIndex(40, name="step"))
    loss.loc[25] += 1.0
    loss.loc[33] = np.inf
    found = find_anomalies(pd.DataFrame({"loss": loss, "grad_norm": 1.0}))
    assert list(zip(found["step"], found["rule"])) == [(25, "loss_spike"), (33, "nonfinite")]
    finite = loss[np.isfinite(loss)]
    fig = go.Figure(go.Scatter(x=finite.index, y=finite.to_numpy(), mode="lines", name="loss"))
    mark_anomalies(fig, found)  # no run column: the only curve
    markers = _markers(fig)
    assert markers["loss_spike"].x == (25,) and markers["loss_spike"].y == pytest.approx((loss.loc[25],))
    assert markers["loss_spike"].xaxis == "x" and "step 25" in markers["loss_spike"].text[0]
    assert _nan_paths(fig.to_plotly_json()) == []
    single = trajectory_figure({"r": loss}, anomalies=found)
    assert _markers(single)["loss_spike"].y == pytest.approx((loss.loc[25],))
    assert _markers(single)["nonfinite"].y == pytest.approx((loss.loc[25],))  # inf is a gap: at the top
    assert _nan_paths(single.to_plotly_json()) == []


def test_no_anomalies_leave_the_figure_alone_and_a_wrong_table_is_refused() -> None:
    series = {"a": pd.Series(np.linspace(5, 2, 20), index=STEPS)}
    plain = trajectory_figure(series)
    marked = trajectory_figure(series, anomalies=pd.DataFrame(columns=COLUMNS))
    assert len(marked.data) == len(plain.data) and not marked.layout.shapes
    with pytest.raises(ValueError, match="threshold"):
        mark_anomalies(plain, pd.DataFrame({"step": [1], "rule": ["x"], "site": ["s"], "value": [1.0]}))

"""What every widget shares: ``show`` sends numeric data as binary arrays, gaps as NaN."""

from __future__ import annotations

import base64

import numpy as np
import plotly.graph_objects as go

from workbench.widgets.common import show


def test_show_sends_numbers_as_binary_arrays_with_nan_for_gaps() -> None:
    z = np.array([[1.0, np.inf], [np.nan, -2.0]])
    figure = go.Figure([go.Scatter(x=[0, 1, 2], y=[1.0, float("nan"), float("-inf")], name="line"),
                        go.Heatmap(z=z, x=[10, 20], y=["a", "b"])])
    target = go.FigureWidget()
    show(target, figure)
    line, heat = target.data
    assert line.name == "line" and list(line.x) == [0, 1, 2]  # integers stay as they were
    y = np.asarray(line.y)
    assert y.dtype == np.float64 and y[0] == 1.0 and np.isnan(y[1:]).all()  # the infinity is a gap too
    assert isinstance(heat.z, dict) and heat.z["dtype"] == "f8" and heat.z["shape"] == "2, 2"
    sent = np.frombuffer(base64.b64decode(heat.z["bdata"]), dtype=np.float64).reshape(2, 2)
    np.testing.assert_array_equal(sent, [[1.0, np.nan], [np.nan, -2.0]])
    assert list(heat.y) == ["a", "b"]

"""Log axes label one tick a decade where their values span two decades or more (plotly's own labels the 2s and
5s between, "10⁴ 5 2 10³ 5 2"), and leave plotly's choice inside a decade or two."""

from __future__ import annotations

import pandas as pd

from workbench.figures.style import log_ticks
from workbench.figures.trajectories import trajectory_figure


def test_log_ticks_follow_the_span() -> None:
    assert log_ticks([1e-9, 3e-7], [None, float("nan"), 0.0, 2e-4]) == {"dtick": 1}
    assert log_ticks([1.0, 50.0]) == {} and log_ticks([]) == {} and log_ticks([0.0, -1.0]) == {}


def test_the_difference_panel_of_gaps_over_decades_labels_decades() -> None:
    steps = range(6)
    reference = pd.Series([1.0] * 6, index=steps)
    other = reference + pd.Series([1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4], index=steps)
    fig = trajectory_figure({"a": reference, "b": other}, reference="a")
    assert fig.layout.yaxis2.type == "log" and fig.layout.yaxis2.dtick == 1
    close = trajectory_figure({"a": reference, "b": reference + 1e-6 * (1 + pd.Series(range(6), index=steps))},
                              reference="a")
    assert close.layout.yaxis2.dtick is None  # under a decade: plotly's own ticks

"""figures.bisect: the operation figure stars the origin; the replay figure draws equal steps and drops NaN."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tests.unit.test_optrace_analysis import T, Trace, _common
from workbench.analysis.optrace import first_operation
from workbench.analysis.replay import ReplayCheck
from workbench.figures.bisect import operation_figure, replay_figure


def test_operation_figure_marks_states_and_stars_the_origin() -> None:
    a = _common(Trace()).op("layers.0.mlp", "mm", [T("h"), T("w1")], [T("m")], source="mlp.py:10") \
        .op("layers.0", "add", [T("h"), T("m")], [T("o")])
    b = _common(Trace()).op("layers.0.mlp", "mm", [T("h"), T("w1")], [T("m*")], source="mlp.py:10") \
        .op("layers.0", "add", [T("h"), T("m*")], [T("o*")])
    fig = operation_figure(first_operation(a.frame(), b.frame()), title="t")
    names = [t.name for t in fig.data]
    assert names[:3] == ["outputs equal", "input differs (downstream)", "outputs differ, inputs equal"]
    star = fig.data[-1]
    assert star.name == "origin: mm (mlp.py:10)" and list(star.x) == [2] and list(star.y) == ["layers.0.mlp"]
    assert list(fig.data[1].x) == [3]  # the add downstream


def test_replay_figure_draws_equal_steps_at_the_floor_and_no_nan() -> None:
    closeness = pd.DataFrame({"loss_rel": [0.0, 1e-7, np.nan], "max_site_rel": [0.0, 1e-5, 2e-3]},
                             index=pd.Index([4, 5, 6], name="step"))
    check = ReplayCheck(original="o", replay="r", deterministic=False, from_step=4, to_step=6, steps=[4, 5, 6],
                        sites=3, first_step=5, first_site="loss", closeness=closeness)
    fig = replay_figure(check)
    assert list(fig.data[0].x) == [4, 5] and fig.data[0].y[0] == 1e-18
    assert "departs at step 5" in fig.layout.title.text
    for trace in fig.data:  # plotly encodes arrays in binary, so look at the values themselves
        assert np.isfinite(np.asarray(trace.y, dtype=float)).all()


def test_the_star_sits_on_the_right_occurrence() -> None:
    a = _common(Trace()).op("mlp", "mm", [T("h"), T("w1")], [T("m1")]).op("mlp", "mm", [T("m1"), T("w2")], [T("m2")])
    b = _common(Trace()).op("mlp", "mm", [T("h"), T("w1")], [T("m1")]).op("mlp", "mm", [T("m1"), T("w2")], [T("m2*")])
    result = first_operation(a.frame(), b.frame())
    assert (result.origin.op, result.origin.occurrence) == ("mm", 1)
    assert list(operation_figure(result).data[-1].x) == [3]

"""figures.operations: the operation figure stars the origin and keeps the model's order; the replay figure marks equal
steps on a strip of their own (no made-up value on its log axis) and drops NaN."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tests.helpers.traces import T, Trace, common_trace
from workbench.analysis.replay_check import ReplayCheck
from workbench.analysis.trace_alignment import first_operation
from workbench.figures.operations import operation_figure, replay_figure, scopes_in_model_order


def test_operation_figure_marks_states_and_stars_the_origin() -> None:
    a = common_trace(Trace()).op("layers.0.mlp", "mm", [T("h"), T("w1")], [T("m")], source="mlp.py:10") \
        .op("layers.0", "add", [T("h"), T("m")], [T("o")])
    b = common_trace(Trace()).op("layers.0.mlp", "mm", [T("h"), T("w1")], [T("m*")], source="mlp.py:10") \
        .op("layers.0", "add", [T("h"), T("m*")], [T("o*")])
    fig = operation_figure(first_operation(a.frame(), b.frame()), title="t")
    names = [t.name for t in fig.data]
    assert names[:3] == ["outputs equal", "input differs (downstream)", "outputs differ, inputs equal"]
    star = fig.data[-1]
    assert star.name == "origin: mm (mlp.py:10)" and list(star.x) == [2] and list(star.y) == ["layers.0.mlp"]
    assert list(fig.data[1].x) == [3]  # the add downstream


def _check(closeness: pd.DataFrame, first_step: int | None) -> ReplayCheck:
    steps = [int(s) for s in closeness.index]
    return ReplayCheck(original="o", replay="r", deterministic=False, from_step=steps[0], to_step=steps[-1],
                       steps=steps, sites=3, first_step=first_step, first_site=None if first_step is None else "loss",
                       closeness=closeness)


def test_replay_figure_marks_equal_steps_on_their_own_strip_and_draws_no_made_up_value() -> None:
    closeness = pd.DataFrame({"loss_rel": [0.0, 1e-7, np.nan], "max_site_rel": [0.0, 1e-5, 2e-3]},
                             index=pd.Index([4, 5, 6], name="step"))
    fig = replay_figure(_check(closeness, first_step=5))
    on_log = [t for t in fig.data if t.yaxis == "y"]
    on_strip = [t for t in fig.data if t.yaxis == "y2"]
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis2.type == "category"
    assert [t.name for t in on_log] == ["loss", "largest site (L2 norm)"]
    assert list(on_log[0].x) == [5] and list(on_log[1].x) == [5, 6]  # the equal step 4 and the NaN step 6 left out
    for trace in on_log:  # plotly encodes arrays in binary, so look at the values themselves
        y = np.asarray(trace.y, dtype=float)
        assert np.isfinite(y).all() and (y > 0).all()  # no stand-in for zero such as 1e-18
    assert [(list(t.x), list(t.y)) for t in on_strip] == [([4], ["loss"]), ([4], ["largest site (L2 norm)"])]
    assert fig.layout.yaxis2.title.text == "equal" and "1e-18" not in fig.layout.yaxis.title.text
    assert "departs at step 5" in fig.layout.title.text


def test_a_replay_equal_everywhere_has_an_empty_log_axis_and_says_so() -> None:
    closeness = pd.DataFrame({"loss_rel": [0.0, 0.0], "max_site_rel": [0.0, 0.0]}, index=pd.Index([7, 8], name="step"))
    fig = replay_figure(_check(closeness, first_step=None))
    assert all(len(t.x) == 0 for t in fig.data if t.yaxis == "y")
    assert all(list(t.x) == [7, 8] for t in fig.data if t.yaxis == "y2")
    assert "reproduced bitwise" in fig.layout.title.text
    assert [a.text for a in fig.layout.annotations if a.name == "no-difference"] == ["no replayed step differs"]


def test_scopes_follow_the_model_and_identity_modules_traced_in_backward_only_sit_in_their_parent() -> None:
    ops = [("forward", "embedding"), ("forward", "layers.0.input_layernorm"), ("forward", "layers.0.self_attention"),
           ("forward", "layers.0.mlp"), ("forward", "layers.0"), ("forward", "output_layer"), ("forward", "model"),
           # backward, in reverse: the identity norm and the dropout have no forward operation
           ("backward", "output_layer"), ("backward", "layers.0.mlp"),
           ("backward", "layers.0.pre_cross_attn_layernorm"),
           ("backward", "layers.0.self_attention.q_layernorm"), ("backward", "layers.0.self_attention"),
           ("backward", "embedding.embedding_dropout"), ("backward", "embedding"), ("optimizer", "(outside modules)")]
    order = scopes_in_model_order(pd.DataFrame(ops, columns=["phase", "scope"]))
    assert order == ["embedding", "embedding.embedding_dropout", "layers.0.input_layernorm", "layers.0.self_attention",
                     "layers.0.self_attention.q_layernorm", "layers.0.pre_cross_attn_layernorm", "layers.0.mlp",
                     "layers.0", "output_layer", "model", "(outside modules)"]


def test_the_operation_figure_rows_are_in_model_order() -> None:
    def step(changed: str) -> Trace:
        t = common_trace(Trace()).op("layers.0.mlp", "mm", [T("h"), T("w1")], [T("m" + changed)])
        t.op("layers.0.mlp", "mm", [T("g" + changed), T("w1")], [T("gm" + changed)], phase="backward")
        t.op("layers.0.pre_mlp_layernorm", "identity", [T("g" + changed)], [T("g" + changed)], phase="backward")
        return t.op("embedding", "embedding_backward", [T("g" + changed)], [T("ge" + changed)], phase="backward")

    fig = operation_figure(first_operation(step("").frame(), step("*").frame()), title="t")
    rows = list(fig.layout.yaxis.categoryarray)[::-1]  # plotly draws the first category at the bottom
    assert rows == ["embedding", "layers.0", "layers.0.pre_mlp_layernorm", "layers.0.mlp"]


def test_the_star_sits_on_the_right_occurrence() -> None:
    a = common_trace(Trace()).op("mlp", "mm", [T("h"), T("w1")], [T("m1")])
    a.op("mlp", "mm", [T("m1"), T("w2")], [T("m2")])
    b = common_trace(Trace()).op("mlp", "mm", [T("h"), T("w1")], [T("m1")])
    b.op("mlp", "mm", [T("m1"), T("w2")], [T("m2*")])
    result = first_operation(a.frame(), b.frame())
    assert (result.origin.op, result.origin.occurrence) == ("mm", 1)
    assert list(operation_figure(result).data[-1].x) == [3]

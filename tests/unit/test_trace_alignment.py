"""analysis.trace_alignment: origin, one-run-only operations, TP merging and alignment on made-up traces."""

from __future__ import annotations

import pytest

from tests.helpers.traces import T, Trace, common_trace
from workbench.analysis.trace_alignment import first_operation
from workbench.errors import EmptyTraceError


def test_identical_traces() -> None:
    result = first_operation(common_trace(Trace()).frame(), common_trace(Trace()).frame())
    assert result.identical and result.origin is None and result.aligned == 2
    assert set(result.operations["outputs"]) == {"equal"}


def test_origin_is_the_first_operation_with_equal_inputs_and_different_outputs() -> None:
    a = common_trace(Trace()).op("layers.0.mlp", "mm", [T("h"), T("w1")], [T("m")], source="mlp.py:10 in forward") \
        .op("layers.0", "add", [T("h"), T("m")], [T("o")])
    b = common_trace(Trace()).op("layers.0.mlp", "mm", [T("h"), T("w1")], [T("m*")], source="mlp.py:10 in forward") \
        .op("layers.0", "add", [T("h"), T("m*")], [T("o*")])
    result = first_operation(a.frame(), b.frame())
    assert result.verdict == "origin"
    assert (result.origin.scope, result.origin.op, result.origin.source) == ("layers.0.mlp", "mm",
                                                                              "mlp.py:10 in forward")
    assert result.downstream == 1 and result.first_affected.scope == "layers.0"
    assert "origin: forward mm #0 in layers.0.mlp" in result.summary()
    assert list(result.operations["outputs"]) == ["equal", "equal", "differ", "differ"]


def test_an_operation_of_one_run_only_that_changes_a_tensor_is_the_origin() -> None:
    a = common_trace(Trace()).op("layers.0.mlp", "gelu", [T("h")], [T("g")]).op("layers.0", "add", [T("h"), T("g")],
                                                                           [T("o")])
    # B's MLP has extra operations (a view and an in-place write): the add after them must still align with A's.
    b = common_trace(Trace()).op("layers.0.mlp", "gelu", [T("h")], [T("g")]) \
        .op("layers.0.mlp", "view", [T("g")], [T("g")]) \
        .op("layers.0.mlp", "copy_", [T("g"), T("x", ())], [T("one", ()), T("g*")], source="faults.py:48") \
        .op("layers.0", "add", [T("h"), T("g*")], [T("o*")])
    result = first_operation(a.frame(), b.frame())
    assert result.verdict == "unaligned"
    assert (result.origin.run, result.origin.op, result.origin.source) == ("b", "copy_", "faults.py:48")
    assert (result.only_a, result.only_b) == (0, 2)


def test_tensor_parallel_ranks_merge_and_the_reduction_only_one_layout_has_is_found() -> None:
    # A (TP=1): one matmul over the full inner dimension.
    a = common_trace(Trace()).op("layers.0.proj", "mm", [T("h", (4, 8)), T("w", (8, 4))], [T("y", (4, 4))]) \
        .op("layers.0", "add", [T("h"), T("y", (4, 4))], [T("o")])
    # B (TP=2): each rank multiplies its half (split inputs, partial outputs), then an all-reduce sums them.
    b = Trace()
    for rank in (0, 1):
        b.op("embedding", "embedding", [T("tok"), T("w")], [T("e")], tp_rank=rank)
        b.op("layers.0", "add", [T("e"), T("e")], [T("h")], tp_rank=rank)
        b.op("layers.0.proj", "mm", [T(f"h{rank}", (4, 4)), T(f"w{rank}", (4, 4))], [T(f"p{rank}", (4, 4))],
             tp_rank=rank)
        b.op("layers.0.proj", "c10d.allreduce_", [T(f"p{rank}", (4, 4))], [T("y2", (4, 4))], tp_rank=rank,
             source="mappings.py:31 in _reduce")
        b.op("layers.0", "add", [T("h"), T("y2", (4, 4))], [T("o2")], tp_rank=rank)
    result = first_operation(a.frame(), b.frame())
    assert result.verdict == "unaligned"
    assert (result.origin.run, result.origin.scope, result.origin.op) == ("b", "layers.0.proj", "c10d.allreduce_")
    assert list(result.operations["outputs"])[2] == "unknown"  # the partial sums are not comparable


def test_an_input_that_differs_before_any_traced_operation_is_reported_as_untraced() -> None:
    a = Trace().op("embedding", "embedding", [T("tok"), T("w")], [T("e")])
    b = Trace().op("embedding", "embedding", [T("tok"), T("w*")], [T("e*")])
    result = first_operation(a.frame(), b.frame())
    assert result.verdict == "untraced" and result.origin is None
    assert "state before the step differs" in result.summary()


def test_micro_batches_are_aligned_separately() -> None:
    # B's micro-batch 0 has an extra op; without micro-batch groups its later ops would shift onto A's.
    a, b = Trace(), Trace()
    for mb in (0, 1):
        a.op("mlp", "gelu", [T(f"x{mb}")], [T(f"g{mb}")], mb=mb)
        b.op("mlp", "gelu", [T(f"x{mb}")], [T(f"g{mb}")], mb=mb)
        if mb == 0:
            b.op("mlp", "gelu", [T("z")], [T("zz")], mb=mb)
    result = first_operation(a.frame(), b.frame())
    assert result.identical and result.only_b == 1


def test_empty_trace_is_refused() -> None:
    with pytest.raises(EmptyTraceError, match="holds no operations"):
        first_operation(Trace().frame(), common_trace(Trace()).frame())


def test_same_layout_aligns_by_input_shapes_too() -> None:
    # Two gradient accumulations that ran in the other order: names alone would pair a bias with a weight.
    bias, weight = [T("gb", (4,)), T("b", (4,))], [T("gw", (4, 8)), T("w", (4, 8))]
    a = common_trace(Trace()).op("mlp", "add_", bias, [T("gb2", (4,))], phase="backward") \
        .op("mlp", "add_", weight, [T("gw2", (4, 8))], phase="backward")
    b = common_trace(Trace()).op("mlp", "add_", weight, [T("gw2", (4, 8))], phase="backward") \
        .op("mlp", "add_", bias, [T("gb2", (4,))], phase="backward")
    result = first_operation(a.frame(), b.frame())
    assert result.identical and (result.only_a, result.only_b) == (1, 1)
    assert set(result.operations["inputs"]) == {"equal"}


def test_untraced_stays_the_verdict_when_a_later_operation_also_differs() -> None:
    a = Trace().op("embedding", "embedding", [T("tok"), T("w")], [T("e")]).op("mlp", "gelu", [T("x")], [T("g")])
    b = Trace().op("embedding", "embedding", [T("tok"), T("w*")], [T("e*")]).op("mlp", "gelu", [T("x")], [T("g*")])
    result = first_operation(a.frame(), b.frame())
    assert result.verdict == "untraced" and result.origin is None
    assert result.first_affected.op == "embedding"


def test_uninitialised_memory_is_not_a_difference() -> None:
    def run(junk: str) -> Trace:
        t = common_trace(Trace())
        t.op("attn", "slice", [T(junk)], [T(junk, defined=False)], source="megatron/core/utils.py:635 in get_tensor")
        return t.op("attn", "baddbmm", [T(junk), T("q"), T("k")], [T("s")])  # beta = 0: the junk is overwritten
    result = first_operation(run("junk-a").frame(), run("junk-b").frame())
    assert result.identical, result.summary()


def test_a_trace_file_round_trips_and_a_damaged_line_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from workbench.errors import DamagedStoreError
    from workbench.store.op_trace import TracedOperation, read_trace, write_trace

    ops = [TracedOperation(seq=i, rank=0, tp_rank=0, phase="forward", microbatch=0, scope="layers.0", op="add",
                           occurrence=i, source="x.py:1 in f", inputs=[T("a"), T("b", (2, 2))],
                           outputs=[T("c", defined=False)]) for i in range(3)]
    path = write_trace(tmp_path / "step_000001" / "rank0.jsonl", ops)
    frame = read_trace([path])
    assert list(frame["seq"]) == [0, 1, 2] and frame.loc[1, "inputs"] == [T("a"), T("b", (2, 2))]
    assert frame.loc[2, "outputs"][0].defined is False and frame.loc[0, "node"] is None
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(DamagedStoreError, match="rank0.jsonl:4"):
        read_trace([path])

"""The Triton statistics kernel run by Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``, which must be
set before triton is first imported, so ``tests/unit/test_triton_pass.py`` runs this file in a process of its
own): fingerprints, counts and extremes bitwise equal to the numpy reference and the native pass, sums to
rounding, for every type, shards, activation placements, special values and wrapped indices."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from workbench.recorder import kernels  # noqa: E402
from workbench.recorder.placement import activation_placement, parameter_placement  # noqa: E402
from workbench.statistics import (  # noqa: E402
    PRECISION_LIMITS,
    STAT_NAMES,
    assemble,
    fingerprint_reference,
    merge_stats,
    pack_fingerprint,
    stats_reference,
)

EXACT = [i for i, name in enumerate(STAT_NAMES) if name not in ("sum", "sum_sq", "l2")]
PRECISION = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp32",
             torch.float8_e4m3fn: "fp8", torch.float8_e5m2: "fp8"}
SPECIAL = {  # each type's NaN, infinities (none in e4m3fn), zeros, subnormals and largest values
    torch.float32: [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-40, -3e-45, 2.0**61, -3e38, 3.4e38],
    torch.bfloat16: [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.01e-39, -9.2e-41, 2.0**61, 3.38e38,
                     -3.38e38, 3.38e38],
    torch.float16: [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 6e-8, -3e-5, 65504.0, -65504.0],
    torch.float64: [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-310, 2.0**61, 1e150, -1e154],
    torch.float8_e4m3fn: [float("nan"), 0.0, -0.0, 2.0**-9, -2.0**-7, 448.0, -448.0],
    torch.float8_e5m2: [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 2.0**-16, 57344.0, -57344.0],
}


@pytest.fixture(scope="module")
def interpreted() -> ModuleType:
    """``workbench.recorder.triton_pass``, its kernels made for Triton's interpreter."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.fail("run these under TRITON_INTERPRET=1, set before triton is imported "
                    "(tests/unit/test_triton_pass.py does)")
    from workbench.recorder import triton_pass

    assert triton_pass.INTERPRETED
    return triton_pass


def read(module: ModuleType, x: torch.Tensor, coords: torch.Tensor, precision: str, **how: Any) -> \
        tuple[np.ndarray, int]:
    """The statistics vector and fingerprint the interpreted kernel gives ``x``."""
    acc, lanes = kernels.new_accumulators(torch.device("cpu"))
    assert module.accumulate(x, kernels.host_rows(coords), *PRECISION_LIMITS[precision], acc, lanes, **how)
    return assemble(acc[:8].numpy(), acc[8:].numpy()), pack_fingerprint(*lanes.tolist())


def bits(x: torch.Tensor) -> np.ndarray:
    """What the numpy reference fingerprints: the elements' bit patterns."""
    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]).numpy()


def assert_agrees(stats: np.ndarray, expected: np.ndarray) -> None:
    """Counts and extremes bitwise; sum and sum of squares to float32 rounding of per-lane partials."""
    np.testing.assert_array_equal(stats[EXACT], expected[EXACT])
    np.testing.assert_allclose(stats, expected, rtol=2e-6, equal_nan=True)


@pytest.mark.parametrize("dtype", list(PRECISION))
def test_every_type_with_nan_infinities_zeros_subnormals_and_huge_values(interpreted: ModuleType,
                                                                         dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(7)
    values = torch.randn(5000, generator=generator, dtype=torch.float64) * 3  # 5 tiles over 4 programs
    values[::397] = torch.tensor(SPECIAL[dtype] * 2, dtype=torch.float64)[:len(values[::397])]
    x = values.to(dtype)
    precision = PRECISION[dtype]
    coords = kernels.identity_coords(x.shape)
    stats, fingerprint = read(interpreted, x, coords, precision)
    assert fingerprint == fingerprint_reference(bits(x))
    expected = stats_reference(x.double().numpy(), precision)
    assert expected[STAT_NAMES.index("nan")] > 0 and expected[STAT_NAMES.index("underflow")] > 0
    assert_agrees(stats, expected)
    # the native pass (the eager one for float8) gives the same bits
    acc, lanes = kernels.new_accumulators(torch.device("cpu"))
    kernels.accumulate(x, coords, *PRECISION_LIMITS[precision], acc, lanes, fused=x.element_size() > 1)
    assert pack_fingerprint(*lanes.tolist()) == fingerprint
    np.testing.assert_array_equal(assemble(acc[:8].numpy(), acc[8:].numpy())[EXACT], stats[EXACT])
    # one flipped bit of one element changes the fingerprint
    flipped = x.clone()
    flipped.view(torch.uint8)[4001] ^= 1
    assert read(interpreted, flipped, coords, precision)[1] != fingerprint


def test_a_float32_partial_neither_overflows_nor_loses_small_values_beside_huge_ones(interpreted: ModuleType) -> None:
    # 3e38 squared is past float32: a tile holding it is summed in float64, whole
    x = torch.cat([torch.full((3000,), 3e38), torch.full((3000,), 1e-3)]).to(torch.float32)
    stats, _ = read(interpreted, x, kernels.identity_coords(x.shape), "fp32")
    assert_agrees(stats, stats_reference(x.numpy(), "fp32"))
    assert np.isfinite(stats[STAT_NAMES.index("sum_sq")])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tensor_parallel_shards_merge_to_the_whole(interpreted: ModuleType, dtype: torch.dtype) -> None:
    weight = (torch.randn(40, 130, generator=torch.Generator().manual_seed(1)) * 2).to(dtype)
    expected = stats_reference(weight.double().numpy(), PRECISION[dtype])
    for dim in (0, 1):  # column-parallel (rows apart) and row-parallel (a block of columns in every row)
        parts, fingerprints = [], []
        for rank, shard in enumerate(weight.chunk(2, dim=dim)):
            param = torch.nn.Parameter(shard.contiguous(), requires_grad=False)
            param.tensor_model_parallel = True  # type: ignore[attr-defined]
            param.partition_dim = dim  # type: ignore[attr-defined]
            placement = parameter_placement(param, tp_rank=rank, tp_size=2, dp_rank=0)
            stats, fingerprint = read(interpreted, param, placement.coords(param.device), PRECISION[dtype])
            parts.append(stats)
            fingerprints.append(fingerprint)
        lane_a = sum(f & 0xFFFFFFFF for f in fingerprints)
        lane_b = sum(f >> 32 for f in fingerprints)
        assert pack_fingerprint(lane_a, lane_b) == fingerprint_reference(bits(weight))
        assert_agrees(merge_stats(parts), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_activation_micro_batches_fingerprint_as_the_whole_batch(interpreted: ModuleType, dtype: torch.dtype) -> None:
    full = torch.randn(4, 3, 500, generator=torch.Generator().manual_seed(2)).to(dtype)  # [samples, seq, hidden]
    lane_a = lane_b = 0
    for offset in (0, 2):
        local = full[offset:offset + 2].transpose(0, 1).contiguous()  # Megatron's [seq, batch, hidden]
        placement = activation_placement(tuple(local.shape), sample_offset=offset, global_batch=4,
                                         feature_shard=None, tp_rank=0)
        coords = placement.coords(local.device)
        _, fingerprint = read(interpreted, local, coords, PRECISION[dtype])
        lane_a, lane_b = lane_a + (fingerprint & 0xFFFFFFFF), lane_b + (fingerprint >> 32)
        acc, lanes = kernels.new_accumulators(torch.device("cpu"))
        kernels.accumulate(local, coords, 1e-38, 1e38, acc, lanes)  # the native pass, the same bits
        assert pack_fingerprint(*lanes.tolist()) == fingerprint
    assert pack_fingerprint(lane_a, lane_b) == fingerprint_reference(bits(full))


def test_indices_past_2_to_the_32_wrap_as_the_reference_s(interpreted: ModuleType) -> None:
    x = torch.randn(2, 1500, generator=torch.Generator().manual_seed(3))
    offset = 2**32 - 700  # a shard of a huge tensor: its indices pass 2^32 in the middle of a row
    coords = kernels.coords_tensor([[0, 5000], [offset, 1]])
    index = (np.arange(2)[:, None] * 5000 + offset + np.arange(1500)[None, :]).astype(np.uint64)
    _, fingerprint = read(interpreted, x, coords, "fp32")
    assert fingerprint == fingerprint_reference(x.numpy(), index)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_copy_in_the_same_read_is_exact_and_changes_nothing(interpreted: ModuleType, dtype: torch.dtype) -> None:
    x = torch.randn(3000, generator=torch.Generator().manual_seed(4)).to(dtype)
    copy = torch.empty_like(x)
    coords = kernels.identity_coords(x.shape)
    assert read(interpreted, x, coords, "fp32", copy=copy)[1] == read(interpreted, x, coords, "fp32")[1]
    assert torch.equal(copy.view(torch.uint8), x.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_an_update_is_the_float32_difference_taken_in_registers(interpreted: ModuleType, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(5)
    before = torch.randn(2500, generator=generator).to(dtype)
    after = (before.float() + torch.randn(2500, generator=generator) * 1e-3).to(dtype)
    after[7] = float("nan")
    difference = after.float() - before.float()
    coords = kernels.identity_coords(after.shape)
    stats, fingerprint = read(interpreted, after, coords, "fp32", before=before)
    assert fingerprint == fingerprint_reference(difference.numpy())
    assert_agrees(stats, stats_reference(difference.numpy(), "fp32"))


def test_launches_add_into_the_accumulators_and_repeat_bitwise(interpreted: ModuleType) -> None:
    x = torch.randn(4500, generator=torch.Generator().manual_seed(6))
    coords = kernels.identity_coords(x.shape)
    runs = []
    for _ in range(2):
        acc, lanes = kernels.new_accumulators(torch.device("cpu"))
        for _ in range(2):  # the workspace's counter is ready again after each launch
            assert interpreted.accumulate(x, kernels.host_rows(coords), 1e-38, 1e38, acc, lanes)
        runs.append((acc.clone(), lanes.clone()))
    once, fingerprint = read(interpreted, x, coords, "fp32")
    acc, lanes = runs[0]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    assert acc[0].item() == 2 * x.numel() and acc[8].item() == once[STAT_NAMES.index("max")]
    assert pack_fingerprint(*lanes.tolist()) == pack_fingerprint(2 * (fingerprint & 0xFFFFFFFF),
                                                                 2 * (fingerprint >> 32))


def test_what_the_kernel_does_not_take_is_left_to_the_other_paths(interpreted: ModuleType) -> None:
    acc, lanes = kernels.new_accumulators(torch.device("cpu"))
    x = torch.randn(2, 3, 4, 5)
    whole = kernels.host_rows(kernels.identity_coords(x.shape))
    # four dimensions that do not merge (every one a slice of a larger tensor)
    scattered = kernels.host_rows(kernels.coords_tensor([[0, 10000], [0, 1000], [0, 100], [0, 1]]))
    assert not interpreted.accumulate(x, scattered, 1e-38, 1e38, acc, lanes)
    assert interpreted.accumulate(x, whole, 1e-38, 1e38, acc, lanes)  # merges to one dimension
    assert not interpreted.accumulate(x.int(), whole, 1e-38, 1e38, acc, lanes)
    assert not interpreted.accumulate(x, kernels.host_rows(torch.zeros(4, 2, dtype=torch.int32)), 1e-38, 1e38, acc,
                                      lanes)  # coords not made by coords_tensor: their rows are not on the host
    strided = torch.randn(30, 40).t()  # a strided gradient: read after one copy, as its contiguous self
    _, fingerprint = read(interpreted, strided, kernels.identity_coords(strided.shape), "fp32")
    assert fingerprint == fingerprint_reference(strided.contiguous().numpy())
    assert interpreted.shape_rows((6, 1, 5), ((1, 5), (0, 7), (0, 1))) == (5, [30], [1])
    assert interpreted.shape_rows((2, 3), ((0, 10), (0, 1))) == (0, [2, 3], [10, 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_a_gradient_divided_in_registers_is_what_torch_divides_on_the_cpu(interpreted: ModuleType,
                                                                        dtype: torch.dtype) -> None:
    x = (torch.randn(3000, generator=torch.Generator().manual_seed(8), dtype=torch.float64) * 3).to(dtype)
    x[:5] = torch.tensor([float("inf"), -0.0, 0.0, 1e-39, -2e-38], dtype=torch.float64).to(dtype)
    coords = kernels.identity_coords(x.shape)
    for divisor in (3, 4, 6):  # as the recorder scales an activation gradient to the global batch
        expected = x / divisor
        stats, fingerprint = read(interpreted, x, coords, PRECISION[dtype], divisor=divisor)
        assert fingerprint == fingerprint_reference(bits(expected)), divisor
        assert_agrees(stats, stats_reference(expected.double().numpy(), PRECISION[dtype]))
    # a NaN stays a NaN (its payload bits are the implementation's: torch's own CPU kernels differ in them)
    with_nan = x.clone()
    with_nan[7] = float("nan")
    stats, _ = read(interpreted, with_nan, coords, PRECISION[dtype], divisor=3)
    assert stats[STAT_NAMES.index("nan")] == 1
    float8 = x.to(torch.float8_e4m3fn)
    acc, lanes = kernels.new_accumulators(torch.device("cpu"))
    assert not interpreted.accumulate(float8, kernels.host_rows(coords), 1e-38, 1e38, acc, lanes, divisor=3)


def test_a_table_of_tensors_in_one_launch_reads_each_as_its_own_launch_does(interpreted: ModuleType) -> None:
    # the parameter side: tensors of many shapes, one spanning several items, a shard, an empty one, in one launch;
    # plain, with a copy, and as an update's difference
    generator = torch.Generator().manual_seed(9)
    shapes = [(20000,), (7, 300), (3,), (0,), (130, 64), (5000,)]  # 20,000 elements: two items of 16 tiles
    xs = [(torch.randn(shape, generator=generator) * 2).to(torch.bfloat16) for shape in shapes]
    xs[0][123] = float("nan")
    coords = [kernels.identity_coords(x.shape) for x in xs]
    coords[4] = kernels.coords_tensor([[0, 128], [64, 1]])  # the second half of each row of a [130, 128] weight
    befores = [(x.float() - 1e-2).to(torch.bfloat16) for x in xs]
    for how in ("plain", "copy", "before"):
        copies = [torch.empty_like(x) for x in xs]
        entries = [(x, kernels.host_rows(c), *kernels.new_accumulators(torch.device("cpu")),
                    copy if how == "copy" else None, before if how == "before" else None)
                   for x, c, copy, before in zip(xs, coords, copies, befores)]
        assert interpreted.accumulate_table(entries, 1e-38, 1e38) == ([True] * len(xs), {})
        for x, rows, acc, lanes, copy, before in entries:
            one_acc, one_lanes = kernels.new_accumulators(torch.device("cpu"))
            assert interpreted.accumulate(x, rows, 1e-38, 1e38, one_acc, one_lanes, before=before)
            assert torch.equal(lanes, one_lanes), (how, x.shape)
            np.testing.assert_array_equal(acc.numpy()[[0, 3, 4, 5, 6, 7, 8, 9, 10]],
                                          one_acc.numpy()[[0, 3, 4, 5, 6, 7, 8, 9, 10]])
            np.testing.assert_allclose(acc.numpy(), one_acc.numpy(), rtol=2e-6)
            if copy is not None:
                assert torch.equal(copy.view(torch.uint8), x.view(torch.uint8))
    # a second launch with the same table adds again (every tensor's counter was set back)
    acc, lanes = kernels.new_accumulators(torch.device("cpu"))
    entry = (xs[0], kernels.host_rows(coords[0]), acc, lanes, None, None)
    interpreted.accumulate_table([entry, entry], 1e-38, 1e38)
    assert acc[0].item() == 2 * xs[0].numel()
    scattered = kernels.host_rows(kernels.coords_tensor([[0, 10000], [0, 1000], [0, 100], [0, 1]]))
    assert interpreted.accumulate_table([(torch.randn(2, 3, 4, 5), scattered, acc, lanes, None, None)], 1e-38,
                                        1e38) == ([False], {})


def test_pieces_of_one_parameter_in_a_table_are_folded_once_as_one_group(interpreted: ModuleType) -> None:
    # the distributed optimizer's shards: one parameter's pieces a rank owns add into one site's accumulators; in a
    # table they are one group (items side by side, one counter, one fold), even between other tensors' rows
    weight = torch.randn(50, 700, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    flat = weight.view(-1)
    pieces = [(flat[:17000], 0), (flat[17000:17100], 17000), (flat[30000:], 30000)]
    other = torch.randn(3000, generator=torch.Generator().manual_seed(11)).to(torch.bfloat16)
    acc, lanes = kernels.new_accumulators(torch.device("cpu"))
    other_acc, other_lanes = kernels.new_accumulators(torch.device("cpu"))
    entries = [(pieces[0][0], kernels.host_rows(kernels.coords_tensor([[0, 1]])), acc, lanes, None, None),
               (other, kernels.host_rows(kernels.identity_coords(other.shape)), other_acc, other_lanes, None, None)]
    entries += [(piece, kernels.host_rows(kernels.coords_tensor([[offset, 1]])), acc, lanes, None, None)
                for piece, offset in pieces[1:]]
    assert interpreted.accumulate_table(entries, 1e-38, 1e38) == ([True] * 4, {})
    owned = torch.cat([piece for piece, _ in pieces])
    index = np.concatenate([np.arange(offset, offset + piece.numel()) for piece, offset in pieces]).astype(np.uint64)
    assert pack_fingerprint(*lanes.tolist()) == fingerprint_reference(bits(owned), index)
    stats = assemble(acc[:8].numpy(), acc[8:].numpy())
    assert_agrees(stats, stats_reference(owned.double().numpy(), "bf16"))
    assert pack_fingerprint(*other_lanes.tolist()) == fingerprint_reference(bits(other))
    # the layout: a group's rows side by side, one group number, the group's first item and count on each
    rows = [[0, 0, 0, site, site, n] + [0] * 14 for site, n in ((1, 20000), (2, 3000), (1, 100))]
    laid = interpreted.table_layout([rows[0], rows[2], rows[1]])
    assert [row[13] for row in laid] == [0, 2, 3] and [row[16] for row in laid] == [0, 0, 1]
    assert [row[14:16] for row in laid] == [[0, 3], [0, 3], [3, 1]]


def test_squares_of_tiny_values_are_summed_without_underflow(interpreted: ModuleType) -> None:
    x = torch.full((3000,), 1e-25)
    x[::2] = -3e-30
    stats, _ = read(interpreted, x, kernels.identity_coords(x.shape), "fp32")
    assert_agrees(stats, stats_reference(x.numpy(), "fp32"))
    assert stats[STAT_NAMES.index("sum_sq")] > 0


def test_a_zero_dimensional_tensor_is_read(interpreted: ModuleType) -> None:
    for value in (torch.tensor(2.5, dtype=torch.float64), torch.tensor(-1.5, dtype=torch.bfloat16)):
        stats, fingerprint = read(interpreted, value, kernels.identity_coords(value.shape), "fp32")
        assert fingerprint == fingerprint_reference(bits(value.reshape(1)))
        assert stats[STAT_NAMES.index("count")] == 1 and stats[STAT_NAMES.index("max")] == float(value)

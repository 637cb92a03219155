"""The fingerprint's four properties and the exact merge of shard statistics (hypothesis)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from workbench.recorder import kernels
from workbench.recorder.placement import Placement
from workbench.statistics import (
    PRECISION_LIMITS,
    STAT_NAMES,
    assemble,
    combine_fingerprints,
    fingerprint_reference,
    merge_stats,
    pack_fingerprint,
    stats_reference,
)

DTYPES = [np.float32, np.float16, np.float64]
finite_arrays = st.sampled_from(DTYPES).flatmap(lambda dtype: arrays(
    dtype, st.tuples(st.integers(1, 12), st.integers(1, 12)),
    elements=st.floats(-1e4, 1e4, width=np.dtype(dtype).itemsize * 8, allow_nan=False)))


def kernel_fingerprint(values: np.ndarray, placement: Placement | None = None) -> int:
    x = torch.from_numpy(np.ascontiguousarray(values))
    coords = (placement.coords(x.device) if placement else kernels.identity_coords(x.shape))
    _, _, lanes = kernels.partial_stats(x, coords, 1e-38, 1e38)
    return pack_fingerprint(*lanes.tolist())


@settings(max_examples=60, deadline=None)
@given(finite_arrays)
def test_kernel_matches_the_numpy_reference(values: np.ndarray) -> None:
    assert kernel_fingerprint(values) == fingerprint_reference(values)


@settings(max_examples=60, deadline=None)
@given(finite_arrays, st.randoms(use_true_random=False))
def test_independent_of_reduction_order(values: np.ndarray, random) -> None:  # type: ignore[no-untyped-def]
    # Cut the rows into pieces, fingerprint them in a random order, combine: same value.
    cuts = sorted(random.sample(range(1, values.shape[0]), k=min(3, values.shape[0] - 1)))
    pieces = np.split(np.arange(values.shape[0]), cuts)
    random.shuffle(pieces)
    parts = []
    for rows in pieces:
        placement = Placement(full_shape=values.shape, dims=(0, 1), offsets=(int(rows[0]), 0))
        parts.append(kernel_fingerprint(values[rows], placement))
    assert combine_fingerprints(*parts) == fingerprint_reference(values)


@settings(max_examples=100, deadline=None)
@given(finite_arrays, st.data())
def test_any_single_bit_of_any_element_changes_it(values: np.ndarray, data: st.DataObject) -> None:
    flat = values.reshape(-1).copy()
    element = data.draw(st.integers(0, flat.size - 1))
    bit = data.draw(st.integers(0, flat.dtype.itemsize * 8 - 1))
    unsigned = flat.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[flat.dtype.itemsize])
    unsigned[element] ^= unsigned.dtype.type(1) << unsigned.dtype.type(bit)
    changed = flat.reshape(values.shape)
    assert fingerprint_reference(changed) != fingerprint_reference(values)
    assert kernel_fingerprint(changed) != kernel_fingerprint(values)


@settings(max_examples=100, deadline=None)
@given(finite_arrays, st.data())
def test_a_permutation_changes_it(values: np.ndarray, data: st.DataObject) -> None:
    flat = values.reshape(-1)
    i = data.draw(st.integers(0, flat.size - 1))
    j = data.draw(st.integers(0, flat.size - 1))
    assume(flat.view(np.uint8).reshape(flat.size, -1)[i].tobytes() != flat.view(np.uint8).reshape(flat.size, -1)[j]
           .tobytes())
    swapped = flat.copy()
    swapped[[i, j]] = swapped[[j, i]]
    assert kernel_fingerprint(swapped.reshape(values.shape)) != kernel_fingerprint(values)
    # An XOR of element bits would not see this; a plain sum of bits would not either.
    assert np.bitwise_xor.reduce(swapped.view(np.uint8)) == np.bitwise_xor.reduce(flat.view(np.uint8))


@settings(max_examples=60, deadline=None)
@given(finite_arrays, st.integers(0, 1), st.integers(2, 4))
def test_tensor_parallel_shards_merge_into_the_full_tensor(values: np.ndarray, dim: int, parts: int) -> None:
    assume(values.shape[dim] % parts == 0)
    size = values.shape[dim] // parts
    fps = []
    for rank, shard in enumerate(np.split(values, parts, axis=dim)):
        offsets = [0, 0]
        offsets[dim] = rank * size
        fps.append(kernel_fingerprint(shard, Placement(values.shape, (0, 1), tuple(offsets))))
    assert combine_fingerprints(*fps) == fingerprint_reference(values)


special = st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3e38])


@settings(max_examples=60, deadline=None)
@given(finite_arrays, st.lists(st.tuples(st.integers(0, 10_000), special), max_size=4), st.integers(1, 4))
def test_shard_statistics_merge_into_the_full_tensor_statistics(values: np.ndarray, specials, parts: int) -> None:  # type: ignore[no-untyped-def]
    values = values.astype(np.float32)
    flat = values.reshape(-1)
    for position, value in specials:
        flat[position % flat.size] = value
    pieces = np.array_split(flat, min(parts, flat.size))
    merged = merge_stats([stats_reference(p, "bf16") for p in pieces])
    full = stats_reference(flat, "bf16")
    exact = [STAT_NAMES.index(n) for n in ("count", "min", "max", "absmax", "nan", "inf", "zero", "underflow",
                                             "overflow")]
    np.testing.assert_array_equal(merged[exact], full[exact])
    np.testing.assert_allclose(merged, full, rtol=1e-12, atol=1e-300, equal_nan=True)


@settings(max_examples=40, deadline=None)
@given(finite_arrays)
def test_kernel_statistics_match_the_reference(values: np.ndarray) -> None:
    x = torch.from_numpy(values)
    sums, maxes, _ = kernels.partial_stats(x, kernels.identity_coords(x.shape), 1.1754943508222875e-38,
                                           3.3895313892515355e38)
    got = assemble(sums.numpy(), maxes.numpy())
    np.testing.assert_allclose(got, stats_reference(values, "bf16"), rtol=1e-9, atol=1e-9, equal_nan=True)


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_native_kernel_on_any_piece_of_a_full_tensor_in_any_dimension_order(data: st.DataObject) -> None:
    # A piece of a full tensor (a shard, a micro-batch) whose local dimensions are the full ones in
    # some order: its native fingerprint keys every element by its full index, like the reference.
    ndim = data.draw(st.integers(1, 3))
    full = [data.draw(st.integers(1, 24)) for _ in range(ndim - 1)] + [data.draw(st.sampled_from([1, 9, 40, 70_001]))]
    starts = [data.draw(st.integers(0, n - 1)) for n in full]
    sizes = [data.draw(st.integers(1, n - s)) for n, s in zip(full, starts)]
    order = data.draw(st.permutations(range(ndim)))
    dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    piece = (torch.randn(sizes, generator=generator) * 30).to(dtype)              # in full-dimension order
    for position, value in data.draw(st.lists(st.tuples(st.integers(0, 10**6), special), max_size=4)):
        piece.view(-1)[position % piece.numel()] = value
    local = piece.permute(*order).contiguous()                                     # [sizes[order[k]] ...]
    strides = np.cumprod([1, *full[::-1]])[:-1][::-1]
    coords = kernels.coords_tensor([[starts[d], int(strides[d])] for d in order])
    acc, lanes = kernels.new_accumulators(local.device)
    kernels.accumulate(local, coords, *PRECISION_LIMITS["fp16"], acc, lanes)

    index = np.ravel_multi_index(np.meshgrid(*[np.arange(s) + o for s, o in zip(sizes, starts)], indexing="ij"),
                                 full).reshape(-1)
    bits = piece.view(torch.int16 if piece.element_size() == 2 else torch.int32).numpy()
    assert pack_fingerprint(*(lanes & 0xFFFFFFFF).tolist()) == fingerprint_reference(bits, index)
    expected = stats_reference(piece.float().numpy(), "fp16")
    got = assemble(acc[:8].numpy(), acc[8:].numpy())
    exact = [STAT_NAMES.index(n) for n in ("count", "min", "max", "absmax", "nan", "inf", "zero", "underflow",
                                             "overflow")]
    np.testing.assert_array_equal(got[exact], expected[exact])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-3, equal_nan=True)

"""The compiled statistics kernel agrees with the eager one: fingerprints bitwise, sums to rounding."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.recorder import kernels
from workbench.recorder.placement import activation_placement, parameter_placement
from workbench.statistics import (
    PRECISION_LIMITS,
    STAT_NAMES,
    assemble,
    fingerprint_reference,
    pack_fingerprint,
    stats_reference,
)


@pytest.fixture(scope="module", params=kernels.ISAS)
def isa(request: pytest.FixtureRequest) -> str:
    """Each build of the native kernel that is a code path of its own on this machine (an AVX-512 machine
    runs all three; an AVX2 machine, held to AVX2, builds its native path again)."""
    earlier = {kernels.native(other).instruction_set() for other in kernels.ISAS[:kernels.ISAS.index(request.param)]}
    built = kernels.native(request.param).instruction_set()
    if built in earlier:
        pytest.skip(f"the {request.param} build is the {built} path, tested already")
    return str(request.param)


SHAPES = [((7,), [[0, 1]]), ((33, 700), [[5, 1400], [700, 1]]), ((5, 3, 8), None), ((4, 6, 40), [[2, 4800], [3, 40],
                                                                                                   [0, 1]])]
"""A short tensor (scalar tail only), a row-parallel shard (rows apart in the full tensor), a whole tensor,
and an activation micro-batch (a sample offset; the inner two dimensions one run of indices)."""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_native_equals_eager(dtype: torch.dtype, isa: str) -> None:
    generator = torch.Generator().manual_seed(1)
    for shape, offsets in SHAPES:
        x = (torch.randn(shape, generator=generator) * 100).to(dtype)
        flat = x.view(-1)
        flat[0], flat[1], flat[2] = float("nan"), float("-inf"), 0.0
        flat[-3], flat[-1] = float("inf"), -0.0  # in the vector part, where the shape has one
        coords = kernels.coords_tensor(offsets) if offsets else kernels.identity_coords(x.shape)
        native_acc, native_lanes = kernels.new_accumulators(x.device)
        kernels.native(isa).accumulate(x, coords, 1e-3, 50.0, native_acc, native_lanes)
        eager_acc, eager_lanes = kernels.new_accumulators(x.device)
        kernels.accumulate(x, coords, 1e-3, 50.0, eager_acc, eager_lanes, fused=False)
        assert torch.equal(native_lanes & 0xFFFFFFFF, eager_lanes & 0xFFFFFFFF), f"{dtype} {shape}: lanes differ"
        exact = [0, 3, 4, 5, 6, 7, 8, 9, 10]  # counts and extremes; sums agree to rounding
        assert torch.equal(native_acc[exact], eager_acc[exact]), (native_acc, eager_acc)
        # at most 8 float32 additions per vector lane before float64 (the eager sums are float64):
        # an error within 8 * 2^-24 of the sum of |x|
        bound = 8 * 2**-24 * float(x.double().abs().nan_to_num(posinf=0).sum())
        assert abs(float(native_acc[1] - eager_acc[1])) <= bound
        assert abs(float(native_acc[2] - eager_acc[2])) <= 8 * 2**-24 * float(eager_acc[2])


@pytest.mark.parametrize("precision", sorted(PRECISION_LIMITS))
def test_counts_under_each_precision_s_limits_equal_the_eager_ones(precision: str, isa: str) -> None:
    # the limits a run really passes (fp32's largest is float32's own largest finite value), with NaN and
    # +-Inf inside the vector part: an Inf is never an overflow (the reference counts finite values only)
    tiny, largest = PRECISION_LIMITS[precision]
    x = torch.randn(4096, generator=torch.Generator().manual_seed(2)) * 1e4
    x[100], x[2000], x[3000], x[3001] = float("inf"), float("-inf"), float("nan"), 1e-39
    native_acc, native_lanes = kernels.new_accumulators(x.device)
    kernels.native(isa).accumulate(x, kernels.identity_coords(x.shape), tiny, largest, native_acc, native_lanes)
    eager_acc, eager_lanes = kernels.new_accumulators(x.device)
    kernels.accumulate(x, kernels.identity_coords(x.shape), tiny, largest, eager_acc, eager_lanes, fused=False)
    counts = [0, 3, 4, 5, 6, 7]
    assert torch.equal(native_acc[counts], eager_acc[counts]), (native_acc[counts], eager_acc[counts])
    assert float(native_acc[7]) == float(np.sum(np.isfinite(x.numpy()) & (np.abs(x.numpy()) > largest)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_difference_is_read_as_the_float32_tensor_the_subtraction_gives(dtype: torch.dtype, isa: str) -> None:
    generator = torch.Generator().manual_seed(2)
    for shape, offsets in SHAPES:
        before = torch.randn(shape, generator=generator).to(dtype)
        after = (before.float() - 1e-3 * torch.randn(shape, generator=generator)).to(dtype)  # an update's size
        after.view(-1)[0] = before.view(-1)[0]  # an exact zero
        after.view(-1)[-1] = float("nan")
        coords = kernels.coords_tensor(offsets) if offsets else kernels.identity_coords(after.shape)
        fused_acc, fused_lanes = kernels.new_accumulators(after.device)
        kernels.native(isa).accumulate_differences([after], [before], [coords], 1e-38, 3.4e38, [fused_acc],
                                                   [fused_lanes])
        if dtype == torch.float16:  # numpy converts a half NaN as the hardware does; torch's scalar loop does not
            difference = torch.from_numpy(after.numpy().astype(np.float32) - before.numpy().astype(np.float32))
        else:
            difference = after.float() - before.float()
        plain_acc, plain_lanes = kernels.new_accumulators(after.device)
        kernels.accumulate(difference, coords, 1e-38, 3.4e38, plain_acc, plain_lanes, fused=False)
        assert torch.equal(fused_lanes & 0xFFFFFFFF, plain_lanes & 0xFFFFFFFF), f"{dtype} {shape}: lanes differ"
        exact = [0, 3, 4, 5, 6, 7, 8, 9, 10]
        assert torch.equal(fused_acc[exact], plain_acc[exact]), (fused_acc, plain_acc)
        torch.testing.assert_close(fused_acc[1:3], plain_acc[1:3], rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_pass_that_copies_gives_the_plain_statistics_and_an_exact_copy(dtype: torch.dtype, isa: str) -> None:
    generator = torch.Generator().manual_seed(4)
    for shape, offsets in SHAPES:
        x = (torch.randn(shape, generator=generator) * 7).to(dtype)
        x.view(-1)[1] = float("nan")
        coords = kernels.coords_tensor(offsets) if offsets else kernels.identity_coords(x.shape)
        copy = torch.full_like(x, 123.0)
        copied_acc, copied_lanes = kernels.new_accumulators(x.device)
        kernels.native(isa).accumulate_copies([x], [copy], [coords], 1e-3, 50.0, [copied_acc], [copied_lanes])
        plain_acc, plain_lanes = kernels.new_accumulators(x.device)
        kernels.native(isa).accumulate(x, coords, 1e-3, 50.0, plain_acc, plain_lanes)
        assert torch.equal(copy.view(torch.int16 if x.element_size() == 2 else torch.int32),
                           x.view(torch.int16 if x.element_size() == 2 else torch.int32)), f"{dtype} {shape}"
        assert torch.equal(copied_acc, plain_acc) and torch.equal(copied_lanes, plain_lanes)


def test_differences_of_float64_tensors_and_of_the_eager_path_are_taken_in_torch() -> None:
    before = torch.randn(40, dtype=torch.float64)
    after = before + 1e-3
    coords = kernels.identity_coords(after.shape)
    results = []
    for fused in (True, False):
        acc, lanes = kernels.new_accumulators(after.device)
        kernels.accumulate_differences([(after, before, coords, acc, lanes)], 1e-38, 3.4e38, fused=fused)
        results.append(lanes & 0xFFFFFFFF)
    expected = pack_fingerprint(*results[0].tolist())
    assert torch.equal(results[0], results[1])
    assert expected == fingerprint_reference((after.float() - before.float()).numpy())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_compiled_equals_eager(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    for shape in [(7,), (33, 17), (5, 3, 8)]:
        x = (torch.randn(shape, generator=generator) * 100).to(dtype)
        x.view(-1)[0] = float("nan")
        coords = kernels.identity_coords(x.shape)
        e = kernels.partial_stats(x, coords, 1e-30, 1e30, fn=kernels.eager())
        c = kernels.partial_stats(x, coords, 1e-30, 1e30, fn=kernels.compiled())
        assert torch.equal(e[2], c[2]), f"{dtype} {shape}: fingerprint lanes differ"
        torch.testing.assert_close(e[0], c[0], rtol=1e-12, atol=1e-9)
        torch.testing.assert_close(e[1], c[1])


def test_a_statistics_graph_that_fails_to_compile_leaves_the_eager_pass_and_one_warning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # torch 2.11's inductor failed on CUDA where the bounds were symbolic floats; whatever a compiler
    # raises, the training around the recorder goes on, with the same numbers.
    def broken(fn, **options):  # type: ignore[no-untyped-def]
        def call(*args):  # type: ignore[no-untyped-def]
            raise RuntimeError("backend='inductor' raised:\nprims::convert_element_type() Expected a value")
        return call

    monkeypatch.setattr(kernels.torch, "compile", broken)
    kernels.compiled.cache_clear()
    try:
        fn = kernels.compiled()
        x, y = torch.randn(33, 17), torch.randn(4, 5, 6)
        with pytest.warns(RuntimeWarning, match="torch.compile of the statistics pass failed on cpu"):
            first = kernels.partial_stats(x, kernels.identity_coords(x.shape), 1e-30, 1e30, fn=fn)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: not a warning per tensor
            second = kernels.partial_stats(y, kernels.identity_coords(y.shape), 1e-30, 1e30, fn=fn)
        for got, tensor in ((first, x), (second, y)):
            expected = kernels.partial_stats(tensor, kernels.identity_coords(tensor.shape), 1e-30, 1e30,
                                             fn=kernels.eager())
            assert all(torch.equal(a, b) for a, b in zip(got, expected))
    finally:
        kernels.compiled.cache_clear()


def test_the_bounds_are_constants_of_the_compiled_graph_one_graph_per_pair() -> None:
    x = torch.tensor([1e-35, 1.0, 5e35, 0.0])
    coords = kernels.identity_coords(x.shape)
    for tiny, largest in ((1e-30, 1e30), (1e-38, 1e38)):
        e = kernels.partial_stats(x, coords, tiny, largest, fn=kernels.eager())
        c = kernels.partial_stats(x, coords, tiny, largest, fn=kernels.compiled())
        assert torch.equal(e[0], c[0])  # the counts under and over each pair's bounds


def test_the_compiled_graph_takes_the_bounds_as_constants_not_as_tensors_read_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A float left to Dynamo becomes a 0-d float64 tensor input read back with .item(), which torch 2.11's
    # inductor failed to lower for CUDA graphs (every recorded step then took the eager pass).
    graphs: list[torch.fx.GraphModule] = []
    real_compile = torch.compile

    def capturing(fn, **options):  # type: ignore[no-untyped-def]
        def backend(gm: torch.fx.GraphModule, example_inputs):  # type: ignore[no-untyped-def]
            graphs.append(gm)
            return gm.forward
        return real_compile(fn, **{**options, "backend": backend})

    monkeypatch.setattr(kernels.torch, "compile", capturing)
    kernels.compiled.cache_clear()
    try:
        for shape in ((9,), (4, 6)):
            x = torch.randn(shape)
            kernels.partial_stats(x, kernels.identity_coords(x.shape), 1e-30, 1e30, fn=kernels.compiled())
    finally:
        kernels.compiled.cache_clear()
    assert graphs
    for gm in graphs:
        inputs = [node.meta.get("example_value") for node in gm.graph.nodes if node.op == "placeholder"]
        assert not [v for v in inputs if isinstance(v, torch.Tensor) and v.dtype == torch.float64 and v.ndim == 0]
        assert ".item()" not in gm.code


def test_activation_placement_keys_elements_by_global_sample() -> None:
    # Megatron activations are [seq, batch, hidden]; two micro-batches of 2 samples each
    # must fingerprint like the full [4, seq, hidden] tensor in sample-major order.
    full = torch.randn(4, 3, 5)                                  # [samples, seq, hidden]
    lanes = torch.zeros(2, dtype=torch.int64)
    for offset in (0, 2):
        local = full[offset:offset + 2].transpose(0, 1).contiguous()   # [seq, 2, hidden]
        placement = activation_placement(tuple(local.shape), sample_offset=offset, global_batch=4,
                                          feature_shard=None, tp_rank=0)
        lanes += kernels.partial_stats(local, placement.coords(local.device), 1e-38, 1e38)[2]
    assert pack_fingerprint(*lanes.tolist()) == fingerprint_reference(full.numpy())


def test_parameter_placement_of_a_tensor_parallel_shard() -> None:
    weight = torch.randn(8, 6)
    lanes = torch.zeros(2, dtype=torch.int64)
    for rank, shard in enumerate(weight.chunk(2, dim=1)):
        param = torch.nn.Parameter(shard.contiguous())
        param.tensor_model_parallel = True  # type: ignore[attr-defined]
        param.partition_dim = 1  # type: ignore[attr-defined]
        placement = parameter_placement(param, tp_rank=rank, tp_size=2, dp_rank=0)
        assert placement.full_shape == (8, 6) and placement.contributes
        lanes += kernels.partial_stats(param, placement.coords(param.device), 1e-38, 1e38)[2]
    assert pack_fingerprint(*lanes.tolist()) == fingerprint_reference(weight.numpy())
    replica = parameter_placement(torch.nn.Parameter(torch.ones(3)), tp_rank=1, tp_size=2, dp_rank=0)
    assert not replica.contributes
    assert not parameter_placement(torch.nn.Parameter(torch.ones(3)), tp_rank=0, tp_size=1, dp_rank=1).contributes


def test_empty_tensor() -> None:
    sums, maxes, lanes = kernels.partial_stats(torch.zeros(0), kernels.identity_coords((0,)), 1e-38, 1e38)
    stats = assemble(sums.numpy(), maxes.numpy())
    assert stats[0] == 0 and np.isnan(stats[1:]).all() and lanes.tolist() == [0, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_native_statistics_do_not_depend_on_the_thread_count(dtype: torch.dtype) -> None:
    x = (torch.randn(5, 100_003, generator=torch.Generator().manual_seed(3)) * 10).to(dtype)  # ~8 chunks
    coords = kernels.identity_coords(x.shape)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            acc, lanes = kernels.new_accumulators(x.device)
            kernels.accumulate(x, coords, 1e-3, 50.0, acc, lanes)
            results.append((acc, lanes))
    finally:
        torch.set_num_threads(threads)
    for acc, lanes in results[1:]:
        assert torch.equal(acc, results[0][0]) and torch.equal(lanes, results[0][1])  # bitwise, sums included
    lanes = results[0][1] & 0xFFFFFFFF
    bits = x.view(torch.int16).numpy().view(np.uint16) if x.element_size() == 2 else x.numpy()  # what the lanes read
    assert pack_fingerprint(*lanes.tolist()) == fingerprint_reference(bits)


def test_one_call_over_many_tensors_equals_one_call_each() -> None:
    generator = torch.Generator().manual_seed(5)
    tensors = [(torch.randn(shape, generator=generator) * 3).to(dtype)
               for shape, dtype in [((300, 700), torch.float32), ((7,), torch.bfloat16), ((0,), torch.float32),
                                    ((64, 33), torch.float16), ((5, 3, 8), torch.float64), ((200_001,), torch.float32)]]
    coords = [kernels.identity_coords(x.shape) for x in tensors]
    coords[1] = kernels.coords_tensor([[11, 1]])  # a shard starting at element 11 of its full tensor
    one_by_one = [kernels.new_accumulators(torch.device("cpu")) for _ in tensors]
    for x, c, (acc, lanes) in zip(tensors, coords, one_by_one):
        kernels.accumulate(x, c, 1e-3, 50.0, acc, lanes)
    batched = [kernels.new_accumulators(torch.device("cpu")) for _ in tensors]
    kernels.accumulate_many([(x, c, acc, lanes) for x, c, (acc, lanes) in zip(tensors, coords, batched)],
                            1e-3, 50.0)
    for (a, la), (b, lb) in zip(one_by_one, batched):
        assert torch.equal(a, b) and torch.equal(la, lb)
    shared = kernels.new_accumulators(torch.device("cpu"))  # two micro-batches into one site's accumulators
    kernels.accumulate_many([(tensors[0], coords[0], *shared), (tensors[0], coords[0], *shared)], 1e-3, 50.0)
    assert shared[0][0] == 2 * tensors[0].numel() and torch.equal(shared[1], 2 * one_by_one[0][1])


def test_a_built_kernel_is_imported_again_without_a_build_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process after the first imports the module the first built (``load`` would ask ninja, 1.5-5 s a
    process); a build directory whose lock is held is left to ``load``, which waits for it."""
    from torch.utils import cpp_extension

    built = kernels.native()
    name = built.__name__
    assert kernels._built(name).instruction_set() == built.instruction_set()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    directory = Path(cpp_extension._get_build_directory(name, verbose=False))
    assert kernels._built(name) is None  # nothing built under this root
    (directory / f"{name}.so").write_bytes(b"half written")
    (directory / "lock").touch()
    assert kernels._built(name) is None


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_a_float8_tensor_is_fingerprinted_by_its_bits_and_counted_under_e4m3_limits(dtype: torch.dtype) -> None:
    # a 1-byte element's bits, zero-extended, as the 2-byte types' are (statistics.element_words); the native
    # pass has no 1-byte path, so a CPU float8 tensor goes the eager way, whatever the slot asked for
    values = torch.tensor([0.0, -0.0, 1.5, -2.25, 300.0, 2.0**-8, -448.0, 0.015625] * 5)
    if dtype == torch.float8_e5m2:
        values = torch.cat([values, torch.tensor([float("inf"), float("-inf"), float("nan"), 20000.0])])
    x = values.to(dtype).view(5, -1) if dtype == torch.float8_e4m3fn else values.to(dtype)
    coords = kernels.identity_coords(x.shape)
    tiny, largest = PRECISION_LIMITS["fp8"]
    acc, lanes = kernels.new_accumulators(torch.device("cpu"))
    kernels.accumulate(x, coords, tiny, largest, acc, lanes, fused=True)
    bits = x.view(torch.uint8).numpy()
    assert pack_fingerprint(*lanes.tolist()) == fingerprint_reference(bits)
    stats = assemble(acc[:8].numpy(), acc[8:].numpy())
    expected = stats_reference(x.float().numpy(), "fp8")
    exact = [i for i, name in enumerate(STAT_NAMES) if name not in ("sum", "sum_sq", "l2")]
    np.testing.assert_array_equal(stats[exact], expected[exact])  # counts and extremes exact
    np.testing.assert_allclose(stats, expected, rtol=1e-12, equal_nan=True)
    flipped = x.clone()
    flipped.view(torch.uint8).view(-1)[3] ^= 1  # one bit of one element
    acc2, lanes2 = kernels.new_accumulators(torch.device("cpu"))
    kernels.accumulate(flipped, coords, tiny, largest, acc2, lanes2, fused=True)
    assert pack_fingerprint(*lanes2.tolist()) != pack_fingerprint(*lanes.tolist())

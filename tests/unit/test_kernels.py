"""The compiled statistics kernel agrees with the eager one: fingerprints bitwise, sums to rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.recorder import kernels
from workbench.recorder.placement import activation_placement, parameter_placement
from workbench.statistics import assemble, fingerprint_reference, pack_fingerprint


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_native_equals_eager(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    for shape, offsets in [((7,), [[0, 1]]), ((33, 700), [[5, 1400], [700, 1]]), ((5, 3, 8), None)]:
        x = (torch.randn(shape, generator=generator) * 100).to(dtype)
        flat = x.view(-1)
        flat[0], flat[1], flat[2] = float("nan"), float("-inf"), 0.0
        coords = kernels.coords_tensor(offsets) if offsets else kernels.identity_coords(x.shape)
        results = []
        for fused in (True, False):
            acc, lanes = kernels.new_accumulators(x.device)
            kernels.accumulate(x, coords, 1e-3, 50.0, acc, lanes, fused=fused)
            results.append((acc, lanes & 0xFFFFFFFF))
        (native_acc, native_lanes), (eager_acc, eager_lanes) = results
        assert torch.equal(native_lanes, eager_lanes), f"{dtype} {shape}: fingerprint lanes differ"
        exact = [0, 3, 4, 5, 6, 7, 8, 9, 10]  # counts and extremes; sums agree to rounding
        assert torch.equal(native_acc[exact], eager_acc[exact]), (native_acc, eager_acc)
        # float sums within blocks of 256: error ~1e-9 of the sum of |x|
        bound = 1e-8 * float(x.double().abs().nan_to_num(posinf=0).sum())
        assert abs(float(native_acc[1] - eager_acc[1])) <= bound
        torch.testing.assert_close(native_acc[2], eager_acc[2], rtol=1e-6, atol=0)


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

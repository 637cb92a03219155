"""A distributed optimizer's flat shard of a parameter as blocks of the parameter, each with its place in the
full tensor (``workbench.recorder.placement.flat_boxes``, ``box_placement``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from workbench.recorder.placement import Placement, box_placement, flat_boxes


@pytest.mark.parametrize("shape", [(7,), (3, 5), (4, 3, 2), (1, 9), (5, 1), ()], ids=str)
def test_every_flat_range_is_covered_in_order_by_blocks_of_whole_rows(shape: tuple[int, ...]) -> None:
    size = int(np.prod(shape, dtype=np.int64))
    flat = np.arange(size).reshape(shape)
    for start, stop in itertools.combinations_with_replacement(range(size + 1), 2):
        boxes = flat_boxes(shape, start, stop)
        covered = [flat[box].reshape(-1) for box, _, _ in boxes]
        assert np.array_equal(np.concatenate(covered) if covered else np.array([], dtype=int),
                              np.arange(start, stop)), (start, stop)
        for box, first, end in boxes:
            assert list(flat[box].reshape(-1)) == list(range(first, end))
        assert len(boxes) <= (1 if len(shape) < 2 else 3 if len(shape) == 2 else 2 * len(shape) - 1)


def test_a_block_of_a_tensor_parallel_shard_lands_where_its_elements_are_in_the_full_tensor() -> None:
    full = np.arange(4 * 6).reshape(4, 6)
    shard = Placement(full_shape=(4, 6), dims=(0, 1), offsets=(0, 3))  # TP rank 1 of 2, split along columns
    local = full[:, 3:]
    for box, _, _ in flat_boxes(local.shape, 2, 10):  # a part row, whole rows, a part row
        placed = box_placement(shard, box)
        assert np.array_equal(full[placed.region(local[box].shape)], local[box])


@pytest.mark.parametrize("dp", [2, 3])
def test_data_parallel_replicas_split_the_parameter_side_work_and_cover_each_element_once(dp: int) -> None:
    """Without the distributed optimizer every replica holds the same whole parameter: each reads its even part
    (its blocks), so the work per rank falls as DP grows, and the blocks of all ranks cover every element once,
    each counted (an expert's parameter or a frozen one stays whole, rank 0's)."""
    import torch

    from workbench.recorder.placement import parameter_placement
    from workbench.recorder.targets import ParallelRanks, ParameterTarget, owned_targets

    weight, frozen = torch.nn.Parameter(torch.zeros(5, 7)), torch.nn.Parameter(torch.zeros(3))
    weight.main_grad = torch.zeros(5, 7)  # type: ignore[attr-defined]  # trained: Megatron DDP gave it a buffer
    covered = torch.zeros(5, 7, dtype=torch.int32)
    for rank in range(dp):
        ranks = ParallelRanks(dp_rank=rank, dp_size=dp)
        targets = [ParameterTarget(name, p, parameter_placement(p, tp_rank=0, tp_size=1, dp_rank=rank))
                   for name, p in (("w", weight), ("frozen", frozen))]
        owned = owned_targets(targets, ranks, optimizer=None)
        blocks = [t for t in owned if t.name == "w"]
        assert blocks and all(t.placement.contributes and t.box is not None for t in blocks)
        assert sum(t.view(weight).numel() for t in blocks) in (35 // dp, 35 // dp + 1)
        for t in blocks:
            covered[t.box] += 1
        assert [t.box for t in owned if t.name == "frozen"] == [None]
        whole = owned_targets(targets, ranks, optimizer=None, split_replicas=False)
        assert [t.placement.contributes for t in whole] == [rank == 0, rank == 0]
    assert bool((covered == 1).all())

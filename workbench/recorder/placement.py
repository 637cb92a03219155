"""Where a local tensor sits in the full tensor of its site, and which rank counts it.

A parameter shard of a TP=2 run, one micro-batch of activations on one DP rank, or the
vocabulary shard of the logits are all pieces of one full, layout-independent tensor.
A ``Placement`` maps each local dimension to a full dimension with an offset, so every
element has an index in the full tensor (the fingerprint's key) and a snapshot can be
written into its own region. ``contributes`` is False on replicas (DP ranks > 0 for
parameters; TP ranks > 0 for replicated tensors), so each element is counted once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.recorder.kernels import coords_tensor


@dataclass(frozen=True)
class Placement:
    full_shape: tuple[int, ...]
    """Shape of the full tensor (activations: [samples of the global batch, seq, features])."""
    dims: tuple[int, ...]
    """Local dimension k holds full dimension ``dims[k]``."""
    offsets: tuple[int, ...]
    """Offset of the local piece along each local dimension, in the full dimension it maps to."""
    contributes: bool = True

    def __hash__(self) -> int:
        # the recorder looks placements up at every micro-batch: hash the fields once
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.full_shape, self.dims, self.offsets, self.contributes))
            object.__setattr__(self, "_hash", cached)
        return cached

    def full_strides(self) -> tuple[int, ...]:
        strides, stride = [], 1
        for size in reversed(self.full_shape):
            strides.append(stride)
            stride *= size
        return tuple(reversed(strides))

    def coords(self, device: torch.device) -> torch.Tensor:
        """int32 [local ndim, 2]: offset and full-tensor stride (mod 2^32) of each local dimension."""
        strides = self.full_strides()
        return coords_tensor([[self.offsets[k], strides[self.dims[k]]] for k in range(len(self.dims))], device)

    def region(self, local_shape: tuple[int, ...]) -> tuple[slice, ...]:
        """The slice of the full tensor this piece covers, in full-dimension order."""
        slices: list[slice] = [slice(None)] * len(self.full_shape)
        for k, full_dim in enumerate(self.dims):
            slices[full_dim] = slice(self.offsets[k], self.offsets[k] + local_shape[k])
        return tuple(slices)

    def chunk_shape(self, local_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The local piece's shape in full-dimension order: the snapshot's chunk."""
        chunk = [0] * len(self.full_shape)
        for k, full_dim in enumerate(self.dims):
            chunk[full_dim] = local_shape[k]
        return tuple(chunk)

    def to_full_order(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` with its dimensions in full-tensor order."""
        inverse = sorted(range(len(self.dims)), key=lambda k: self.dims[k])
        return x.permute(*inverse)


def whole(shape: tuple[int, ...], contributes: bool = True) -> Placement:
    return Placement(full_shape=tuple(shape), dims=tuple(range(len(shape))), offsets=(0,) * len(shape),
                     contributes=contributes)


def parameter_placement(param: torch.Tensor, *, tp_rank: int, tp_size: int, dp_rank: int) -> Placement:
    """A parameter (or its gradient or optimizer state): a TP shard along ``partition_dim``, or a replica."""
    shape = tuple(param.shape)
    if not getattr(param, "tensor_model_parallel", False) or tp_size == 1:
        return whole(shape, contributes=dp_rank == 0 and (tp_rank == 0 or tp_size == 1))
    dim = int(param.partition_dim)  # type: ignore[attr-defined]
    full = list(shape)
    full[dim] *= tp_size
    offsets = [0] * len(shape)
    offsets[dim] = tp_rank * shape[dim]
    return Placement(full_shape=tuple(full), dims=tuple(range(len(shape))), offsets=tuple(offsets),
                     contributes=dp_rank == 0)


def activation_placement(shape: tuple[int, ...], *, sample_offset: int, global_batch: int,
                         feature_shard: tuple[int, int] | None, tp_rank: int,
                         seq_shard: tuple[int, int] | None = None) -> Placement:
    """A Megatron activation [seq, batch, *features] as a piece of [global batch, seq, *features].

    ``feature_shard`` = (tp_rank, tp_size) when the last dimension is split over TP ranks
    (the output layer's logits); ``seq_shard`` likewise when the sequence is (sequence
    parallelism); otherwise the tensor is a TP replica and TP rank 0 counts it.
    """
    seq, batch, *features = shape
    seq_offset = 0
    if seq_shard is not None:
        seq_offset = seq_shard[0] * seq
        seq *= seq_shard[1]
    full_features = list(features)
    feature_offsets = [0] * len(features)
    if feature_shard is not None and features:
        rank, size = feature_shard
        full_features[-1] *= size
        feature_offsets[-1] = rank * features[-1]
    return Placement(full_shape=(global_batch, seq, *full_features), dims=(1, 0, *range(2, 2 + len(features))),
                     offsets=(seq_offset, sample_offset, *feature_offsets),
                     contributes=feature_shard is not None or seq_shard is not None or tp_rank == 0)


def token_placement(shape: tuple[int, ...], *, sample_offset: int, global_batch: int, tp_rank: int) -> Placement:
    """A per-token tensor [batch, seq] (the loss) as a piece of [global batch, seq]."""
    batch, seq = shape
    return Placement(full_shape=(global_batch, seq), dims=(0, 1), offsets=(sample_offset, 0),
                     contributes=tp_rank == 0)



Box = tuple[slice, ...]
"""A block of a local tensor, one slice per dimension."""


def flat_boxes(shape: tuple[int, ...], start: int, stop: int) -> list[tuple[Box, int, int]]:
    """The elements ``[start, stop)`` of a tensor of ``shape`` in row-major order (a distributed optimizer's shard of
    a parameter) as blocks of whole rows each: ``(slices, first, end)`` per block, its elements being ``[first, end)``
    of the flat order. A 2-D shard is at most a part row, whole rows, a part row; an n-D one at most 2n - 1."""
    if start >= stop:
        return []
    if not shape:
        return [((), start, stop)]
    row = 1
    for size in shape[1:]:
        row *= size
    rest = tuple(slice(0, size) for size in shape[1:])
    if start % row == 0 and stop % row == 0:
        return [((slice(start // row, stop // row), *rest), start, stop)]
    first, last = start // row, (stop - 1) // row
    if first == last:
        inner = flat_boxes(shape[1:], start - first * row, stop - first * row)
        return [((slice(first, first + 1), *box), first * row + a, first * row + b) for box, a, b in inner]
    head_end, tail_start = -(-start // row) * row, stop // row * row  # the whole rows between
    return (flat_boxes(shape, start, head_end) + flat_boxes(shape, head_end, tail_start)
            + flat_boxes(shape, tail_start, stop))


def box_placement(placement: Placement, box: Box) -> Placement:
    """The placement of a block of a local tensor whose own placement is ``placement``."""
    return Placement(full_shape=placement.full_shape, dims=placement.dims,
                     offsets=tuple(offset + part.start for offset, part in zip(placement.offsets, box)),
                     contributes=placement.contributes)

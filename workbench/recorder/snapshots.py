"""Full-tensor snapshots at chosen steps: each rank writes the pieces it holds into chunks of its own.

A snapshot of a site is the full tensor in full-dimension order under
``snapshots/step_<K>/<kind>/<name>``; a rank's piece (a TP shard, a micro-batch of activations)
is one chunk of it, so no two ranks write the same chunk. Global rank 0 creates the arrays from
every rank's metadata (collective), then each rank hands its pieces to its background writer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from workbench.recorder.placement import Placement
from workbench.recorder.targets import all_gather_objects
from workbench.store import layout
from workbench.store.writer import create_snapshot, write_snapshot_region


@dataclass
class Snapshot:
    path: str
    full_shape: tuple[int, ...]
    chunks: tuple[int, ...]       # this piece's shape in full-dimension order: its own chunk
    region: tuple[slice, ...]     # where the piece sits in the full tensor
    values: np.ndarray            # in full-dimension order
    source_dtype: str


def snapshot_of(step: int, kind: str, name: str, tensor: torch.Tensor, placement: Placement) -> Snapshot:
    """A host copy of ``tensor`` (float32, or float64 for float64 tensors) placed in its site's full tensor."""
    # copy=True: a CPU fp32 tensor would otherwise be shared, and the optimizer changes it
    # before the writer thread reads it.
    dtype = torch.float64 if tensor.dtype == torch.float64 else torch.float32
    values = placement.to_full_order(tensor.detach()).to("cpu", dtype, copy=True)
    local_shape = tuple(tensor.shape)
    return Snapshot(layout.snapshot_path(step, kind, name), placement.full_shape, placement.chunk_shape(local_shape),
                    placement.region(local_shape), values.numpy(), str(tensor.dtype).removeprefix("torch."))


def write_snapshots(run_dir: Path, snapshots: list[Snapshot], *, rank: int,
                    submit: Callable[[Callable[[], None]], None]) -> None:
    """Create every rank's snapshot arrays (global rank 0; collective), then hand this rank's pieces to
    ``submit`` (the background writer)."""
    meta = [(s.path, s.full_shape, s.chunks, s.source_dtype, str(s.values.dtype)) for s in snapshots]
    gathered = all_gather_objects(meta)
    if rank == 0:
        created = set()
        for path, shape, chunks, source_dtype, dtype in (m for rank_meta in gathered for m in rank_meta):
            if path not in created:
                create_snapshot(run_dir, path, shape, chunks, dtype, source_dtype)
                created.add(path)
    if dist.is_initialized():
        dist.barrier()
    for snap in snapshots:
        submit(functools.partial(write_snapshot_region, run_dir, snap.path, snap.region, snap.values))

"""What one recorded step holds until it is written: accumulators per site, then their reduction.

Each site recorded in a step gets a row of accumulators, float64 [11] (8 sums, then max,
-min, absmax) and int64 [2] (fingerprint lane sums), handed out as rows of blocks of 64 (one
allocation per 64 sites); every micro-batch adds into its site's row. At the end of the step
the rows become a ``PendingStep``; ``launch_reduction`` adds (and maxes) the pending steps over
every rank in three all-reduces per flush, never a gather of tensors (on a GPU on a side stream,
copied to pinned host memory there), and its ``Reduction`` gives their statistics and
fingerprints in the registry's order once they are on the host.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from workbench.recorder import kernels
from workbench.recorder.snapshots import Snapshot
from workbench.statistics import assemble, pack_fingerprints

_BLOCK = 64


@dataclass
class Accumulator:
    acc: torch.Tensor      # [11] float64: 8 sums, then max, -min, absmax
    lanes: torch.Tensor    # [2] int64: fingerprint lane sums


@dataclass
class PendingStep:
    row: int
    sites: list[str]
    sums: torch.Tensor     # [n_local, 8]
    maxes: torch.Tensor    # [n_local, 3]
    lanes: torch.Tensor    # [n_local, 2]


@dataclass
class StepState:
    """One recorded step in progress."""

    acc: dict[str, Accumulator] = field(default_factory=dict)
    """Each site's accumulators, in the order the sites were first recorded in this step."""
    snapshots: list[Snapshot] = field(default_factory=list)
    grads_recorded: bool = False
    _blocks: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    _used: int = 0

    def accumulator(self, site: str, device: torch.device) -> Accumulator:
        """``site``'s accumulators, empty on its first micro-batch of the step."""
        found = self.acc.get(site)
        if found is None:
            if not self._blocks or self._used == _BLOCK or self._blocks[-1][0].device != device:
                acc, lanes = kernels.new_accumulators(device)
                self._blocks.append((acc.repeat(_BLOCK, 1), lanes.repeat(_BLOCK, 1)))
                self._used = 0
            acc_block, lane_block = self._blocks[-1]
            found = self.acc[site] = Accumulator(acc_block[self._used], lane_block[self._used])
            self._used += 1
        return found

    def pending(self, row: int, device: torch.device) -> PendingStep:
        """The step's accumulators as one pending row of the store."""
        sites = list(self.acc)
        if not sites:
            return PendingStep(row, [], torch.zeros(0, 8, dtype=torch.float64, device=device),
                               torch.zeros(0, 3, dtype=torch.float64, device=device),
                               torch.zeros(0, 2, dtype=torch.int64, device=device))
        if len({acc.device for acc, _ in self._blocks}) == 1:  # the rows in site order: the blocks in a row
            acc = torch.cat([acc for acc, _ in self._blocks])[:len(sites)]
            lanes = torch.cat([lanes for _, lanes in self._blocks])[:len(sites)]
        else:
            acc = torch.stack([self.acc[s].acc.to(device) for s in sites])
            lanes = torch.stack([self.acc[s].lanes.to(device) for s in sites])
        return PendingStep(row, sites, acc[:, :8], acc[:, 8:], lanes)


class Reduction:
    """The pending steps of one flush, summed over every rank: on a GPU computed on a side stream and copied to
    pinned host memory there, so that the training stream never waits; ``result`` waits for it (on the writer's
    thread, or at once where the numbers are needed now)."""

    def __init__(self, rows: list[int], sums: torch.Tensor, maxes: torch.Tensor, lanes: torch.Tensor,
                 done: torch.cuda.Event | None) -> None:
        self._rows, self._sums, self._maxes, self._lanes, self._done = rows, sums, maxes, lanes, done

    def result(self) -> tuple[list[int], np.ndarray, np.ndarray]:
        """(rows, stats [k, sites, stat] float64, fingerprints [k, sites] uint64)."""
        if self._done is not None:
            self._done.synchronize()
        stats = assemble(self._sums.numpy(), self._maxes.numpy())
        return self._rows, stats, pack_fingerprints(self._lanes.numpy())


def _upload(values: list[int], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``: from pinned memory without waiting, on a GPU."""
    host = torch.tensor(values, dtype=torch.int64, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


def launch_reduction(pending: list[PendingStep], index: dict[str, int], device: torch.device, *,
                     rank: int) -> Reduction | None:
    """Start summing the pending steps over every rank (collective: three all-reduces, on a GPU on a side stream
    that waits for the training stream's work, never the other way round). None on every rank but global rank
    0, which gets the ``Reduction`` to wait on."""
    on_gpu = device.type == "cuda"
    side = _side_stream(device) if on_gpu else None
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        n, k = len(index), len(pending)
        sums = torch.zeros(k, n, 8, dtype=torch.float64, device=device)
        maxes = torch.full((k, n, 3), float("-inf"), dtype=torch.float64, device=device)
        lanes = torch.zeros(k, n, 2, dtype=torch.int64, device=device)
        for i, step in enumerate(pending):
            if step.sites:
                where = _upload([index[s] for s in step.sites], device)
                for target, part in ((sums, step.sums), (maxes, step.maxes), (lanes, step.lanes)):
                    if side is not None and part.device == device:  # made on the training stream, read here
                        part.record_stream(side)
                    target[i, where] = part.to(device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sums)
            dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
            dist.all_reduce(lanes)
        if rank != 0:
            return None
        if side is None:
            return Reduction([p.row for p in pending], sums.cpu(), maxes.cpu(), lanes.cpu(), None)
        host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in (sums, maxes, lanes)]
        for target, source in zip(host, (sums, maxes, lanes)):
            target.copy_(source, non_blocking=True)
        done = torch.cuda.Event(blocking=True)  # the writer's thread sleeps until it, not spinning a core
        done.record(side)
    return Reduction([p.row for p in pending], host[0], host[1], host[2], done)


@functools.cache
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)

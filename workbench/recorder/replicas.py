"""Replicas agree, or the recorder says where they parted.

A tensor-parallel group holds some parameters whole on every rank (the layer norms, the biases of row-parallel
layers, the position embedding): every rank must compute the same gradient for its copy and update it the same
way. The recorder counts such a tensor once, from TP rank 0, so a copy that parts on another rank would show only
through what it computes, a step later and elsewhere. Here every rank hashes its copy of each replicated parameter
as a recorded step begins (the values its forward uses) and its reduced gradient (after ``finalize_model_grads``),
on the device; at each flush a TP group gathers its hashes and compares them with TP rank 0's, and global rank 0
gathers what each group found. The first (step, site, TP rank) whose copy differs is the manifest's
``replicas_parted``. In a correct run the copies stay bitwise equal: a replicated tensor is computed from the same
inputs in the same order on every rank (under sequence parallelism its gradient is summed over the group).

The hash is a weighted sum of the elements' bits (int64, wrapping): equal copies give equal hashes in any order
of summation, and a copy that differs in one bit gives another hash but with a chance of 2**-64.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from workbench.recorder.targets import ParallelRanks, ParameterTarget, all_gather_objects
from workbench.sites import site_id

_WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MULTIPLIER, _OFFSET = 0x9E3779B1, 0x7F4A7C15


def bits_hash(x: torch.Tensor) -> torch.Tensor:
    """int64 scalar on ``x``'s device: the sum of each element's bits (plus one) times a weight from its index."""
    words = x.detach().reshape(-1).view(_WORDS[x.element_size()]).to(torch.int64)  # [n]
    index = torch.arange(words.numel(), device=x.device, dtype=torch.int64)
    return ((words + 1) * (index * _MULTIPLIER + _OFFSET)).sum()


def _order(parting: Parting) -> tuple[int, bool, str, int]:
    """Execution order: the step, a parameter (read as the step begins) before a gradient, then by name and rank."""
    return parting.step, parting.site.startswith("grad:"), parting.site, parting.tp_rank


@dataclass(frozen=True)
class Parting:
    """Where a replica first parted: the step, the site (``param:NAME`` or ``grad:NAME``) and the TP rank whose
    copy differs from TP rank 0's."""

    step: int
    site: str
    tp_rank: int

    def to_dict(self) -> dict[str, object]:
        return {"step": self.step, "site": self.site, "tp_rank": self.tp_rank}


class ReplicaCheck:
    """The hashes of a rank's TP-replicated parameters and their gradients, per recorded step, compared over the
    TP group at each flush (collective: every rank calls ``compare`` at the same flushes)."""

    def __init__(self, targets: Sequence[ParameterTarget], ranks: ParallelRanks) -> None:
        self.tp_size = ranks.tp_size
        self.targets = [t for t in targets if ranks.tp_size > 1 and ranks.tensor_parallel(t.param)[1] > 1
                        and not getattr(t.param, "tensor_model_parallel", False)]
        self._rows: list[tuple[int, str, torch.Tensor]] = []  # (step, kind, hashes [targets]) in execution order
        self.first: Parting | None = None
        """The earliest parting found in the whole job so far (global rank 0 knows it; others know their own)."""

    @property
    def active(self) -> bool:
        """Whether there is anything to compare: tensor parallelism and replicated parameters (the same on every
        rank of a run, so every rank makes the same collectives or none)."""
        return self.tp_size > 1

    def params(self, step: int) -> None:
        """Hash each replicated parameter as step ``step`` begins."""
        if self.targets:
            self._rows.append((step, "param", torch.stack([bits_hash(t.param) for t in self.targets])))

    def grads(self, step: int) -> None:
        """Hash each replicated parameter's reduced gradient (``main_grad`` under Megatron DDP)."""
        if not self.targets:
            return
        hashes = []
        for target in self.targets:
            grad = getattr(target.param, "main_grad", None)
            grad = target.param.grad if grad is None else grad
            hashes.append(bits_hash(grad) if grad is not None else torch.zeros((), dtype=torch.int64,
                                                                                 device=target.param.device))
        self._rows.append((step, "grad", torch.stack(hashes)))

    def compare(self) -> Parting | None:
        """Gather the hashes since the last flush over the TP group and the findings over the job (collective);
        the earliest parting so far, on global rank 0."""
        if not self.active:
            return None
        from megatron.core import parallel_state as ps

        found = None
        if self._rows:
            group = ps.get_tensor_model_parallel_group()
            mine = torch.stack([hashes for _, _, hashes in self._rows])  # [rows, targets]
            gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
            dist.all_gather(gathered, mine, group=group)
            differs = torch.stack(gathered) != gathered[0]  # [tp, rows, targets]
            if bool(differs.any()):
                row = int(differs.any(dim=2).any(dim=0).nonzero()[0])  # the first row (execution order) that parts
                rank = int(differs[:, row].any(dim=1).nonzero()[0])
                target = int(differs[rank, row].nonzero()[0])
                step, kind, _ = self._rows[row]
                found = Parting(step, site_id(kind, self.targets[target].name), rank)
            self._rows = []
        partings = [p for p in all_gather_objects(found) if p is not None]
        if self.first is not None:
            partings.append(self.first)
        if partings:
            self.first = min(partings, key=_order)
        return self.first

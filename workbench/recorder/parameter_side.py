"""The model-sized sites: parameters, gradients, Adam moments and updates, a batch per kernel call.

At the start of a recorded step every parameter's statistics (and, for the ``update`` sites,
its copy into a buffer kept between recorded steps) in one native call; the gradients (views
into Megatron DDP's contiguous buffer) in one call before and after the data-parallel
reduction; both moments in one call after the optimizer step; then the updates, each taken as
(parameter - its start-of-step copy) inside the pass.

Under Megatron's distributed optimizer each data-parallel rank reads, for ``param``, ``grad``, the moments and
``update``, the blocks of the flat shard of each parameter it owns (``targets.owned_targets``): its part of the
gradient is the reduced one (reduce-scatter), its state is its own, and its part of the parameters is current
when the step begins even when the others' are gathered during the forward (``overlap_param_gather``). Each
block is a piece of the full tensor with its own placement, so the fingerprint merges them by element index as it
merges tensor-parallel shards. ``grad_local`` (before any reduction) still reads the whole local gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from workbench.recorder.placement import Placement
from workbench.recorder.slots import Slots
from workbench.recorder.targets import ParameterTarget, adam_moments
from workbench.sites import site_id


class ParameterSide:
    def __init__(self, targets: Sequence[ParameterTarget], *, slots: Slots, kinds: set[str],
                 wanted: Callable[[str], bool], owned: Sequence[ParameterTarget] | None = None) -> None:
        self.targets = list(targets)
        """Every local parameter, whole (``grad_local``)."""
        self.owned = list(targets if owned is None else owned)
        """What this rank reads for the other kinds: the same, or its blocks of a distributed optimizer's shards."""
        self._positions = {target.name: i for i, target in enumerate(self.targets)}
        """Each parameter's place in the model: its sites' place among their kind's, on every rank alike."""
        self._slots, self._kinds, self._wanted = slots, kinds, wanted
        self._before: dict[tuple[str, Placement], torch.Tensor] = {}
        """Each ``update`` block's parameter as the step began (buffers reused at every recorded step)."""

    def begin(self) -> None:
        """The parameters as the forward will see them, and their copies for the ``update`` sites."""
        slots = self._slots
        copies, plain = [], []
        for target in self.owned:
            param = target.view(target.param.detach())
            before = None
            if "update" in self._kinds and target.placement.contributes and \
                    self._wanted(site_id("update", target.name)):
                # One buffer per parameter, kept between recorded steps: a copy into it costs a
                # third of a fresh clone (no allocation, no page faults).
                key = (target.name, target.placement)
                before = self._before.get(key)
                if before is None:
                    before = self._before[key] = torch.empty_like(param, requires_grad=False)
            slot = slots.slot("param", target.name, target.placement, param,
                              position=self._positions[target.name]) if "param" in self._kinds else None
            if slot is not None and slot.site is not None:
                slots.snapshot(slot, param)
                acc = slots.accumulator(slot)
                if before is not None:  # the parameter's statistics and its copy in one read
                    copies.append((param, before, slot.coords, acc.acc, acc.lanes))
                else:
                    plain.append((param, slot.coords, acc.acc, acc.lanes))
            elif before is not None:
                before.copy_(param)
        slots.add_copies(copies)
        slots.add_many(plain)

    def gradients(self, kind: str) -> None:
        """``grad_local`` (each DP rank's own partial sum; DP rank 0's counts) or ``grad`` (reduced)."""
        entries = []
        for target in self.targets if kind == "grad_local" else self.owned:
            # Megatron DDP's main_grad is a view into the contiguous grad buffer: the batch reads the
            # buffer's segments in one native call.
            grad = getattr(target.param, "main_grad", None)
            grad = target.param.grad if grad is None else grad
            if grad is not None:
                entries.append((kind, target.name, target.view(grad), target.placement))
        self._slots.record_many(entries, self._positions)

    def after_optimizer(self, optimizer: Any) -> None:
        """The moments (if there is an optimizer) and the updates, once the optimizer has stepped."""
        if optimizer is not None and self._kinds & {"exp_avg", "exp_avg_sq"}:
            moments = list(adam_moments(optimizer, self.owned))
            # both moments in one pass, every first moment registered before the second ones
            self._slots.record_many([("exp_avg", t.name, avg, t.placement) for t, avg, _ in moments
                                     if "exp_avg" in self._kinds]
                                    + [("exp_avg_sq", t.name, avg_sq, t.placement) for t, _, avg_sq in moments
                                       if "exp_avg_sq" in self._kinds], self._positions)
        if "update" in self._kinds:
            self._updates()

    def _updates(self) -> None:
        """Each parameter minus its copy from the start of the step, element by element inside the
        statistics pass (materialised only for a snapshot)."""
        slots = self._slots
        differences, materialised = [], []
        for target in self.owned:
            after = target.view(target.param.detach())
            slot = slots.slot("update", target.name, target.placement, after, torch.float32,
                              position=self._positions[target.name])
            before = self._before.get((target.name, target.placement))  # copied when the step began
            if before is None or slot.site is None:
                continue
            acc = slots.accumulator(slot)
            if slots.snapshot_due(slot.site):
                update = after.float() - before.float()
                slots.snapshot(slot, update)
                materialised.append((update, slot.coords, acc.acc, acc.lanes))
            else:
                differences.append((after, before, slot.coords, acc.acc, acc.lanes))
        slots.add_differences(differences)
        slots.add_many(materialised)

"""The model-sized sites: parameters, gradients, Adam moments and updates, a batch per kernel call.

At the start of a recorded step every parameter's statistics (and, for the ``update`` sites,
its copy into a buffer kept between recorded steps) in one native call; the gradients (views
into Megatron DDP's contiguous buffer) in one call before and after the data-parallel
reduction; both moments in one call after the optimizer step; then the updates, each taken as
(parameter - its start-of-step copy) inside the pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from workbench.recorder.slots import Slots
from workbench.recorder.targets import ParameterTarget, adam_moments
from workbench.sites import site_id


class ParameterSide:
    def __init__(self, targets: Sequence[ParameterTarget], *, slots: Slots, kinds: set[str],
                 wanted: Callable[[str], bool]) -> None:
        self.targets = list(targets)
        self._slots, self._kinds, self._wanted = slots, kinds, wanted
        self._before: dict[str, torch.Tensor] = {}
        """Each ``update`` site's parameter as the step began (buffers reused at every recorded step)."""

    def begin(self) -> None:
        """The parameters as the forward will see them, and their copies for the ``update`` sites."""
        slots = self._slots
        copies, plain = [], []
        for target in self.targets:
            before = None
            if "update" in self._kinds and target.placement.contributes and \
                    self._wanted(site_id("update", target.name)):
                # One buffer per parameter, kept between recorded steps: a copy into it costs a
                # third of a fresh clone (no allocation, no page faults).
                before = self._before.get(target.name)
                if before is None:
                    before = self._before[target.name] = torch.empty_like(target.param, requires_grad=False)
            slot = slots.slot("param", target.name, target.placement, target.param) \
                if "param" in self._kinds else None
            param = target.param.detach()
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
        for target in self.targets:
            # Megatron DDP's main_grad is a view into the contiguous grad buffer: the batch reads the
            # buffer's segments in one native call.
            grad = getattr(target.param, "main_grad", None)
            grad = target.param.grad if grad is None else grad
            if grad is not None:
                entries.append((kind, target.name, grad, target.placement))
        self._slots.record_many(entries)

    def after_optimizer(self, optimizer: Any) -> None:
        """The moments (if there is an optimizer) and the updates, once the optimizer has stepped."""
        if optimizer is not None and self._kinds & {"exp_avg", "exp_avg_sq"}:
            moments = list(adam_moments(optimizer, self.targets))
            # both moments in one pass, every first moment registered before the second ones
            self._slots.record_many([("exp_avg", t.name, avg, t.placement) for t, avg, _ in moments
                                     if "exp_avg" in self._kinds]
                                    + [("exp_avg_sq", t.name, avg_sq, t.placement) for t, _, avg_sq in moments
                                       if "exp_avg_sq" in self._kinds])
        if "update" in self._kinds:
            self._updates()

    def _updates(self) -> None:
        """Each parameter minus its copy from the start of the step, element by element inside the
        statistics pass (materialised only for a snapshot)."""
        slots = self._slots
        differences, materialised = [], []
        for target in self.targets:
            slot = slots.slot("update", target.name, target.placement, target.param, torch.float32)  # in order
            before = self._before.get(target.name)  # copied when the step began
            if before is None or slot.site is None:
                continue
            acc = slots.accumulator(slot)
            after = target.param.detach()
            if slots.snapshot_due(slot.site):
                update = after.float() - before.float()
                slots.snapshot(slot, update)
                materialised.append((update, slot.coords, acc.acc, acc.lanes))
            else:
                differences.append((after, before, slot.coords, acc.acc, acc.lanes))
        slots.add_differences(differences)
        slots.add_many(materialised)

"""From a tensor to its site's accumulators: the one place the recorder calls the statistics pass.

A *slot* is where one tensor of a site goes: the site (None where the tensor is not recorded:
filtered out, or a replica that another rank counts), its placement in the full tensor, and the
kernel's coordinates for it. Slots are made on first sight (registering the site) and cached by
(kind, name, placement). ``Slots`` also holds the step being recorded (its accumulators and
snapshots); ``Stopwatch`` adds up the recorder's own time in a step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from workbench.recorder import kernels
from workbench.recorder.placement import Placement
from workbench.recorder.registry import SiteRegistry
from workbench.recorder.snapshots import snapshot_of
from workbench.recorder.step_state import Accumulator, StepState
from workbench.statistics import PRECISION_LIMITS

F = TypeVar("F", bound=Callable[..., Any])


class Stopwatch:
    """The recorder's own time in the current step, from every method ``timed`` wraps.

    The recorder's torch calls skip torch-function modes: a mode in Python (the CPU runner's
    device mapping) costs microseconds per call, and the recorder makes thousands a step, none of
    which a mode should change.
    """

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, fn: F) -> F:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                with torch._C.DisableTorchFunction():
                    return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return wrapper  # type: ignore[return-value]

    def take(self) -> float:
        """The seconds so far, and start again from zero."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds


@dataclass(frozen=True)
class Slot:
    kind: str
    name: str
    site: str | None
    placement: Placement
    coords: torch.Tensor
    device: torch.device
    native: bool
    """Whether the native kernel takes the site's tensors (on the CPU, unless the eager path was asked for)."""


Entry = tuple[str, str, torch.Tensor, Placement]
"""(kind, name, tensor, placement): one tensor to record."""


class Slots:
    def __init__(self, registry: SiteRegistry, *, precision: str, fused: bool,
                 snapshot_wanted: Callable[[str], bool]) -> None:
        self.registry = registry
        self._fused = fused
        self._tiny, self._largest = PRECISION_LIMITS[precision]
        self._snapshot_wanted = snapshot_wanted
        self._slots: dict[tuple[str, str, Placement], Slot] = {}
        self.state: StepState | None = None
        """The step being recorded; None between recorded steps (and while paused)."""
        self.step = -1
        self.snapshotting = False
        """Whether the current step takes snapshots."""

    def begin(self, step: int, *, snapshots: bool) -> None:
        self.step, self.snapshotting, self.state = step, snapshots, StepState()

    def slot(self, kind: str, name: str, placement: Placement, tensor: torch.Tensor,
             dtype: torch.dtype | None = None, position: int | None = None) -> Slot:
        """The slot of ``name``'s ``kind`` site at ``placement`` (registering the site on first sight, at
        ``position`` among its kind's if given: ``SiteRegistry.register``)."""
        slot = self._slots.get((kind, name, placement))
        if slot is None:
            site = self.registry.register(kind, name, placement.full_shape,
                                          str(dtype or tensor.dtype).removeprefix("torch."), position)
            recorded = site is not None and placement.contributes
            slot = self._slots[(kind, name, placement)] = Slot(
                kind, name, site if recorded else None, placement, placement.coords(tensor.device), tensor.device,
                self._fused and kernels.takes_native(tensor))
        return slot

    def accumulator(self, slot: Slot) -> Accumulator:
        assert self.state is not None and slot.site is not None
        return self.state.accumulator(slot.site, slot.device)

    def accumulate(self, slot: Slot, tensor: torch.Tensor, *, divisor: int = 1) -> None:
        """Add one tensor of a recorded slot (``tensor / divisor``: on a GPU divided in the kernel's registers)
        into this step's accumulators (and snapshot it if due)."""
        acc = self.accumulator(slot)
        if self.snapshotting:
            self.snapshot(slot, kernels.divided(tensor, divisor))
        if slot.native:  # hundreds of calls a step: straight to the kernel
            tensor = kernels.divided(tensor, divisor)
            kernels.native().accumulate(tensor if tensor.is_contiguous() else tensor.contiguous(), slot.coords,
                                        self._tiny, self._largest, acc.acc, acc.lanes)
            kernels.PATHS["native"] += 1
        else:
            kernels.accumulate(tensor, slot.coords, self._tiny, self._largest, acc.acc, acc.lanes, fused=self._fused,
                               divisor=divisor)

    def record(self, kind: str, name: str, tensor: torch.Tensor, placement: Placement) -> None:
        slot = self.slot(kind, name, placement, tensor)
        if slot.site is not None:
            self.accumulate(slot, tensor)

    def record_many(self, entries: list[Entry], positions: Mapping[str, int] | None = None) -> None:
        """Record each entry: the statistics of all of them in one kernel call (``positions``: each name's place
        among its kind's sites, if not where it is first seen)."""
        items = []
        for kind, name, tensor, placement in entries:
            slot = self.slot(kind, name, placement, tensor, position=None if positions is None else positions[name])
            if slot.site is not None:
                acc = self.accumulator(slot)
                self.snapshot(slot, tensor)
                items.append((tensor, slot.coords, acc.acc, acc.lanes))
        self.add_many(items)

    # the batched kernel calls, each over a list of (tensor(s), coords, acc, lanes)

    def add_many(self, items: list[Any]) -> None:
        kernels.accumulate_many(items, self._tiny, self._largest, fused=self._fused)

    def add_copies(self, items: list[Any]) -> None:
        """Each item's statistics, and its tensor copied into the buffer beside it, in one read."""
        kernels.accumulate_copies(items, self._tiny, self._largest, fused=self._fused)

    def add_differences(self, items: list[Any]) -> None:
        """The statistics of each item's (after - before), element by element, never materialised."""
        kernels.accumulate_differences(items, self._tiny, self._largest, fused=self._fused)

    # snapshots

    def snapshot_due(self, site: str) -> bool:
        return self.snapshotting and self._snapshot_wanted(site)

    def snapshot(self, slot: Slot, tensor: torch.Tensor) -> None:
        """Keep a host copy of ``tensor`` for the store if this step snapshots its site."""
        if slot.site is not None and self.snapshot_due(slot.site):
            assert self.state is not None
            self.state.snapshots.append(snapshot_of(self.step, slot.kind, slot.name, tensor, slot.placement))

"""The live reference inside a training process: global rank 0 compares what it flushes with the reference
(``analysis.live``), and at each flush every rank learns, by one small broadcast from rank 0, whether the run
has departed, so that all of them stop at the same step.

    live = LiveCheck(load_reference(REF) if rank == 0 else None, rank=rank)   # recorder.reference
    recorder = Recorder(..., live=live)          # rank 0: each flush's fingerprints and statistics
    live.scalars(step, row)                      # rank 0: each step's loss, grad norm, ...
    departure = live.announce(run_dir, step=step, keep_going=False)   # every rank, at each flush

Nothing is added to the recorder's hot path: the comparison runs where a flush already holds the reduced
numbers on the host, and the broadcast is one pickled object per flush.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch.distributed as dist

from workbench.analysis.live import Departure, LiveReference
from workbench.store.writer import update_manifest


class LiveCheck:
    """The reference (global rank 0 only; None elsewhere) and the first departure found."""

    def __init__(self, reference: LiveReference | None, *, rank: int) -> None:
        self.reference = reference
        self.rank = rank
        self.departure: Departure | None = None
        """The first departure rank 0 found (on the other ranks: once ``verdict`` has told them)."""
        self.announced = False
        """Whether the departure has been told (the run stops, or trains on with ``--keep-going``): from then
        on nothing more is compared."""

    def sites(self, steps: Sequence[int], sites: Sequence[str], fingerprints: np.ndarray, stats: np.ndarray) -> None:
        """Rank 0, as a flush lands: compare its steps, keep the first departure."""
        if self.reference is not None and not self.announced:
            self._keep(self.reference.sites(steps, sites, fingerprints, stats))

    def scalars(self, step: int, row: Mapping[str, float]) -> None:
        """Rank 0, for every step: compare its scalars, keep the first departure (the earlier step wins)."""
        if self.reference is not None and not self.announced:
            self._keep(self.reference.scalars(step, row))

    def _keep(self, found: Departure | None) -> None:
        """Keep the earlier departure; at one step, a site's (it names where, in execution order) over a
        scalar's."""
        if found is None:
            return
        current = self.departure
        if current is None or found.step < current.step or \
                (found.step == current.step and found.on_site and not current.on_site):
            self.departure = found

    def verdict(self) -> Departure | None:
        """The departure, on every rank (collective: every rank calls it at the same steps, until it is
        announced)."""
        if dist.is_initialized() and dist.get_world_size() > 1:
            box = [self.departure.to_dict() if self.rank == 0 and self.departure is not None else None]
            dist.broadcast_object_list(box, src=0)
            self.departure = Departure.from_dict(box[0]) if box[0] is not None else None
        return self.departure

    def announce(self, run_dir: Path, *, step: int, keep_going: bool) -> Departure | None:
        """At a flush after ``step`` (every rank): the verdict and, for the first departure, its record in the
        manifest (``diverged``: the departure and the step the run stops after, None with ``keep_going``)
        written by rank 0; from then on nothing more is compared."""
        departure = self.verdict()
        if departure is not None:
            self.announced = True
            if self.rank == 0:
                update_manifest(run_dir, diverged={**departure.to_dict(),
                                                   "stopped_after": None if keep_going else step})
        return departure

"""The resume check: does a run resumed from a checkpoint follow the uninterrupted run?

    check = resume_check(resumed, uninterrupted)     # from the resumed run's own resume step
    check.identical, check.first_step, check.first_site

Only steps from the resume step on say anything about the checkpoint: before it both runs
computed the same steps in one process each. A deterministic run resumed from a complete
checkpoint (parameters, optimizer state, schedulers, data position, RNG) must be bitwise
identical from there on; the first difference names what the checkpoint missed.

A run started at *another layout* from a checkpoint (``workbench run --start-from``) is not
bitwise the uninterrupted run at its new layout: the two layouts' trajectories parted at step 0.
Its check says where it first departs and, given the run that wrote the checkpoint as the
*floor*, whether it stays within the noise floor: at each step, the largest relative
difference of a site's RMS between the resumed run and the reference, against the same
between the floor run and the reference (the two layouts' own distance). A resharding that
lost or misplaced state shows orders of magnitude above it; ``FLOOR_FACTOR`` is the margin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from workbench.analysis.compare import Comparison, compare
from workbench.errors import ArgumentError, IncomparableRunsError
from workbench.store.records import RunRecords


@dataclass(frozen=True)
class ResumeCheck:
    resumed: str
    reference: str
    from_step: int
    steps: list[int]
    """Common recorded steps from ``from_step`` on."""
    sites: int
    first_step: int | None
    first_site: str | None
    differing_sites: int
    """Sites that differ at ``first_step``."""
    gaps: dict[int, float] | None = None
    """Per checked step, the largest relative difference of a site's RMS against the reference."""
    floor: str | None = None
    """The run whose distance to the reference is the noise floor (the checkpoint's writer)."""
    floor_gaps: dict[int, float] | None = None
    """Per checked step, the largest relative difference of a site's RMS between the floor run and the reference."""

    @property
    def identical(self) -> bool:
        return self.first_step is None

    @property
    def floor_ratio(self) -> float | None:
        """The largest ratio of the resumed run's gap to the floor's over the checked steps (None without a floor)."""
        if self.gaps is None or self.floor_gaps is None:
            return None
        ratios = [self.gaps[s] / self.floor_gaps[s] if self.floor_gaps[s] > 0 else
                  (0.0 if self.gaps[s] == 0 else float("inf")) for s in self.gaps if s in self.floor_gaps]
        return max(ratios) if ratios else None

    @property
    def within_floor(self) -> bool | None:
        """Identical, or every checked step's gap within ``FLOOR_FACTOR`` times the floor's (None without one)."""
        if self.identical:
            return True
        ratio = self.floor_ratio
        return None if ratio is None else ratio <= FLOOR_FACTOR

    @property
    def passed(self) -> bool:
        """Within the noise floor where there is one, else bitwise identical: what ``resume-check`` exits 0 on."""
        return bool(self.within_floor) if self.floor is not None else self.identical

    def summary(self, *, escape: Callable[[str], str] = str) -> str:
        """What ``workbench resume-check`` prints; run and site names pass through ``escape``."""
        head = (f"resume check of {escape(self.resumed)} (resumed at step {self.from_step}) against "
                f"{escape(self.reference)}: "
                f"steps {self.steps[0]}..{self.steps[-1]} ({len(self.steps)} recorded) x {self.sites} sites: ")
        if self.identical:
            return head + "bitwise identical"
        text = head + (f"first differs at step {self.first_step}, site {escape(str(self.first_site))} "
                       f"({self.differing_sites} sites differ at that step)")
        if self.gaps:
            step = max(self.gaps, key=lambda s: self.gaps[s])  # type: ignore[index]
            text += f"; largest relative RMS difference {self.gaps[step]:.2e} (step {step})"
        ratio = self.floor_ratio
        if ratio is not None:
            verdict = "within" if ratio <= FLOOR_FACTOR else "above"
            text += (f"; at most {ratio:.2f} x the noise floor ({escape(str(self.floor))} vs {escape(self.reference)}, "
                     f"the layouts' own "
                     f"distance): {verdict} the floor (margin {FLOOR_FACTOR:g} x)")
        return text


FLOOR_FACTOR = 10.0
"""How far above the noise floor a resumed run's gap may be and still be within it."""


def _gaps(result: Comparison, steps: list[int]) -> dict[int, float]:
    """Per step, the largest relative difference of a site's RMS (the l2 statistic) over the common sites."""
    rel = result.relative("l2").sel(step=steps).to_numpy()
    return {step: float(np.nanmax(row)) if np.isfinite(row).any() else 0.0 for step, row in zip(steps, rel)}


def resume_check(resumed: RunRecords, reference: RunRecords, *, from_step: int | None = None,
                 floor: RunRecords | None = None) -> ResumeCheck:
    """Compare ``resumed`` with the uninterrupted ``reference`` from the resume step on; with ``floor`` (the
    run that wrote the checkpoint, at another layout), also whether it stays within their noise floor."""
    if from_step is None:
        if not resumed.resumes:
            raise ArgumentError(f"{resumed.name} was never resumed (its manifest lists no resume step); "
                              "pass the step to check from")
        from_step = min(resumed.resumes)
    result = compare(resumed, reference)
    steps = [s for s in result.common_steps if s >= from_step]
    if not steps:
        raise IncomparableRunsError(f"{resumed.name} and {reference.name} share no recorded step from step "
                                    f"{from_step} on")
    first = result.first_difference(steps)
    gaps = floor_gaps = None
    if first is not None:
        gaps = _gaps(result, steps)
        if floor is not None:
            against = compare(floor, reference)
            shared = [s for s in steps if s in set(against.common_steps)]
            if not shared:
                raise IncomparableRunsError(f"{floor.name} and {reference.name} share no recorded step from step "
                                            f"{from_step} on: no noise floor")
            floor_gaps = _gaps(against, shared)
    return ResumeCheck(resumed=resumed.name, reference=reference.name, from_step=from_step, steps=steps,
                       sites=len(result.common_sites), first_step=None if first is None else first.step,
                       first_site=None if first is None else first.site,
                       differing_sites=0 if first is None else first.count, gaps=gaps,
                       floor=floor.name if floor is not None else None,
                       floor_gaps=floor_gaps)

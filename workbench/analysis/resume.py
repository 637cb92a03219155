"""The resume check: does a run resumed from a checkpoint follow the uninterrupted run?

    check = resume_check(resumed, uninterrupted)     # from the resumed run's own resume step
    check.identical, check.first_step, check.first_site

Only steps from the resume step on say anything about the checkpoint: before it both runs
computed the same steps in one process each. A deterministic run resumed from a complete
checkpoint (parameters, optimizer state, schedulers, data position, RNG) must be bitwise
identical from there on; the first difference names what the checkpoint missed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.analysis.compare import IncomparableRunsError, compare
from workbench.analysis.records import RunRecords
from workbench.errors import ArgumentError


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

    @property
    def identical(self) -> bool:
        return self.first_step is None

    def summary(self) -> str:
        head = (f"resume check of {self.resumed} (resumed at step {self.from_step}) against {self.reference}: "
                f"steps {self.steps[0]}..{self.steps[-1]} ({len(self.steps)} recorded) x {self.sites} sites: ")
        if self.identical:
            return head + "bitwise identical"
        return head + (f"first differs at step {self.first_step}, site {self.first_site} "
                       f"({self.differing_sites} sites differ at that step)")


def resume_check(resumed: RunRecords, reference: RunRecords, *, from_step: int | None = None) -> ResumeCheck:
    """Compare ``resumed`` with the uninterrupted ``reference`` from the resume step on."""
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
    equal = result.equal.loc[steps]
    differs = ~equal.to_numpy()
    rows = np.flatnonzero(differs.any(axis=1))
    first_step = first_site = None
    count = 0
    if len(rows):
        first_step = steps[int(rows[0])]
        first_site = result.common_sites[int(np.argmax(differs[rows[0]]))]
        count = int(differs[rows[0]].sum())
    return ResumeCheck(resumed=resumed.name, reference=reference.name, from_step=from_step, steps=steps,
                       sites=len(result.common_sites), first_step=first_step, first_site=first_site,
                       differing_sites=count)

"""The golden-reference check for CI: a run against a stored reference, exact or within a tolerance.

    check = golden_check(run, golden, steps=20)            # bitwise: every fingerprint equal
    check = golden_check(run, golden, steps=20, rtol=1e-6)  # statistics within a relative tolerance
    check.passed, check.differences

Every site and recorded step of the reference up to ``steps`` must be present in the run;
a missing one is a difference too, so a run that silently recorded less cannot pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.analysis.compare import IncomparableRunsError, compare
from workbench.analysis.records import RunRecords
from workbench.errors import ConfigError

TOLERANCE_STATS = ("sum_sq", "min", "max", "absmax", "nan", "inf")
"""Statistics held to ``rtol`` in the tolerant check. Not ``sum``: the sum of a gradient or a
centred activation cancels to near zero, where a relative difference means nothing."""


@dataclass(frozen=True)
class Difference:
    step: int | None
    site: str
    detail: str


@dataclass(frozen=True)
class GoldenCheck:
    run: str
    golden: str
    steps: list[int]
    sites: int
    rtol: float | None
    differences: list[Difference]

    @property
    def passed(self) -> bool:
        return not self.differences

    def summary(self, limit: int = 20) -> str:
        mode = "bitwise" if self.rtol is None else f"rtol {self.rtol:g}"
        head = (f"golden check ({mode}) of {self.run} against {self.golden}: {len(self.steps)} steps x "
                f"{self.sites} sites: ")
        if self.passed:
            return head + "PASSED"
        lines = [head + f"FAILED, {len(self.differences)} differences"]
        lines += [f"  step {d.step}: {d.site}: {d.detail}" for d in self.differences[:limit]]
        if len(self.differences) > limit:
            lines.append(f"  ... and {len(self.differences) - limit} more")
        return "\n".join(lines)


def golden_check(run: RunRecords, golden: RunRecords, *, steps: int | None = None,
                 rtol: float | None = None) -> GoldenCheck:
    """Check ``run`` against ``golden`` on the reference's recorded steps below ``steps`` (all if None)."""
    if rtol is not None and not rtol >= 0:
        raise ConfigError(f"rtol = {rtol!r} is not allowed: a number >= 0")
    wanted = [s for s in golden.steps if steps is None or s < steps]
    if not wanted:
        raise IncomparableRunsError(f"the reference {golden.name} recorded no step below {steps}")
    differences = [Difference(step, "(all sites)", "step not recorded by the run")
                   for step in wanted if step not in set(run.steps)]
    differences += [Difference(None, site, "site not recorded by the run")
                    for site in golden.sites if site not in set(run.sites)]
    result = compare(run, golden)
    checked = [s for s in result.common_steps if s in set(wanted)]
    if rtol is None:
        for step in checked:
            row = result.equal.loc[step]
            differences += [Difference(step, str(site), "fingerprint differs") for site in row.index[~row.to_numpy()]]
    else:
        rel = result.relative_difference.sel(step=checked, stat=list(TOLERANCE_STATS))
        values = np.nan_to_num(rel.transpose("step", "site", "stat").to_numpy(), nan=np.inf)  # NaN: one side only
        for i, j in zip(*np.nonzero(values.max(axis=2) > rtol)):
            k = int(values[i, j].argmax())
            differences.append(Difference(checked[i], result.common_sites[j],
                                          f"{TOLERANCE_STATS[k]} differs by {values[i, j, k]:.3g} (relative)"))
    return GoldenCheck(run=run.name, golden=golden.name, steps=checked, sites=len(result.common_sites),
                       rtol=rtol, differences=differences)

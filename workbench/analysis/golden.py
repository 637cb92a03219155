"""The golden-reference check for CI: a run against a stored reference, exact or within a tolerance.

    check = golden_check(run, golden, steps=20)            # bitwise: every fingerprint and scalar equal
    check = golden_check(run, golden, steps=20, rtol=1e-6)  # within a tolerance (workbench.analysis.tolerance)
    check.passed, check.differences

Every site and recorded step of the reference up to ``steps`` must be present in the run;
a missing one is a difference too, so a run that silently recorded less cannot pass. The
per-step loss and grad norm are checked on the steps below ``steps`` that both runs wrote,
where the reference has them: bitwise, or to ``rtol`` of the trajectory's mean as
Megatron-LM's functional tests hold their golden values. What ``rtol`` means for a site's
statistics is defined once, in ``workbench.analysis.tolerance``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analysis.compare import compare
from workbench.analysis.tolerance import TOLERANCE_QUANTITIES, TOLERANCE_SCALARS, scalar_differences, site_differences
from workbench.errors import ArgumentError, IncomparableRunsError
from workbench.statistics import STAT_NAMES
from workbench.store.records import RunRecords


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
    scalars: tuple[str, ...] = ()
    """The per-step scalars that were checked (those the reference has)."""
    mode: str | None = None
    """How it was checked, where not by ``rtol`` alone (a Megatron-LM golden file)."""
    notes: tuple[str, ...] = ()
    """What was not checked, and why; steps a tolerance let fail."""

    @property
    def passed(self) -> bool:
        return not self.differences

    def summary(self, limit: int = 20, *, escape: Callable[[str], str] = str) -> str:
        """What ``workbench check`` prints; run, site and scalar names pass through ``escape``."""
        mode = self.mode or ("bitwise" if self.rtol is None else f"rtol {self.rtol:g} of each quantity's own scale")
        scalars = escape(", ".join(self.scalars))
        checked = f"{self.sites} sites" + (f" and {scalars}" if scalars else "") if self.sites else scalars
        head = (f"golden check ({mode}) of {escape(self.run)} against {escape(self.golden)}: {len(self.steps)} "
                f"steps x {checked or 'nothing'}: ")
        notes = [f"  note: {escape(n)}" for n in self.notes]
        if self.passed:
            return "\n".join([head + "PASSED", *notes])
        lines = [head + f"FAILED, {len(self.differences)} differences", *notes]
        lines += [f"  step {d.step}: {escape(d.site)}: {escape(d.detail)}" for d in self.differences[:limit]]
        if len(self.differences) > limit:
            lines.append(f"  ... and {len(self.differences) - limit} more")
        return "\n".join(lines)


def golden_check(run: RunRecords, golden: RunRecords, *, steps: int | None = None,
                 rtol: float | None = None) -> GoldenCheck:
    """Check ``run`` against ``golden`` on the reference's recorded steps below ``steps`` (all if None)."""
    if rtol is not None and not rtol >= 0:
        raise ArgumentError(f"rtol = {rtol!r} is not allowed: a number >= 0")
    wanted = [s for s in golden.steps if steps is None or s < steps]
    if not wanted:
        raise IncomparableRunsError(f"the reference {golden.name} recorded no step below {steps}")
    run_steps, run_sites, wanted_steps = set(run.steps), set(run.sites), set(wanted)
    differences = [Difference(step, "(all sites)", "step not recorded by the run")
                   for step in wanted if step not in run_steps]
    differences += [Difference(None, site, "site not recorded by the run")
                    for site in golden.sites if site not in run_sites]
    result = compare(run, golden)
    checked = [s for s in result.common_steps if s in wanted_steps]
    if rtol is None:
        for step in checked:
            row = result.equal.loc[step]
            differences += [Difference(step, str(site), "fingerprint differs") for site in row.index[~row.to_numpy()]]
    else:
        differences += _tolerant_sites(run, golden, checked, result.common_sites, rtol)
    scalar_differences_, scalars = _scalars(run, golden, steps, rtol)
    return GoldenCheck(run=run.name, golden=golden.name, steps=checked, sites=len(result.common_sites),
                       rtol=rtol, differences=differences + scalar_differences_, scalars=scalars)


def _tolerant_sites(run: RunRecords, golden: RunRecords, steps: list[int], sites: list[str],
                    rtol: float) -> list[Difference]:
    def values(records: RunRecords) -> np.ndarray:  # [step, site, stat]
        return np.asarray(records.stats.sel(step=steps, site=sites, stat=list(STAT_NAMES))
                          .transpose("step", "site", "stat").to_numpy(), dtype=float)

    normalised = site_differences(values(run), values(golden))  # [step, site, quantity]
    worst = normalised.max(axis=2)
    found = []
    for i, j in zip(*np.nonzero(worst > rtol)):
        k = int(normalised[i, j].argmax())
        quantity = TOLERANCE_QUANTITIES[k]
        detail = (f"{quantity} count differs" if quantity in ("nan", "inf") else
                  f"{quantity} differs by {normalised[i, j, k]:.3g} of the site's "
                  f"{'absmax' if quantity in ('min', 'max', 'absmax') else 'RMS'}")
        found.append(Difference(steps[i], sites[j], detail))
    return found


def _scalars(run: RunRecords, golden: RunRecords, steps: int | None,
             rtol: float | None) -> tuple[list[Difference], tuple[str, ...]]:
    return scalar_check(run.scalars, golden.scalars, TOLERANCE_SCALARS, steps, rtol)


def scalar_check(ours: pd.DataFrame, theirs: pd.DataFrame, candidates: tuple[str, ...], steps: int | None,
                 rtol: float | None) -> tuple[list[Difference], tuple[str, ...]]:
    """Differences of the per-step scalars (of ``candidates``) the reference has, on the steps both wrote:
    bitwise (NaN equal to NaN), or to ``rtol`` as ``workbench.analysis.tolerance`` defines it."""
    names = tuple(n for n in candidates if n in theirs and np.isfinite(theirs[n].to_numpy(float)).any())
    ours_steps = set(ours.index)
    shared = [int(s) for s in theirs.index if (steps is None or s < steps) and s in ours_steps]
    found: list[Difference] = []
    for name in names:
        if name not in ours or not shared:
            found.append(Difference(None, name, "not recorded by the run"))
            continue
        a = ours.loc[shared, name].to_numpy(dtype=np.float64)
        b = theirs.loc[shared, name].to_numpy(dtype=np.float64)
        if rtol is None:
            differs = (a.view(np.uint64) != b.view(np.uint64)) & ~(np.isnan(a) & np.isnan(b))
            found += [Difference(shared[i], name, f"{a[i]!r} != {b[i]!r} (bitwise)") for i in np.flatnonzero(differs)]
        else:
            normalised = scalar_differences(a, b)
            found += [Difference(shared[i], name, f"differs by {normalised[i]:.3g} of its mean "
                                 f"({a[i]:.6g} vs {b[i]:.6g})") for i in np.flatnonzero(normalised > rtol)]
    return found, names


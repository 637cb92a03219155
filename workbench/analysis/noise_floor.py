"""The noise floor: how far mere repeats of one configuration drift apart, and whether another run stays inside.

* ``noise_floor``: from N runs of one configuration (nondeterministic repeats), the envelope [min, max] of every
  statistic per (step, site).
* ``leaves_floor``: whether another run stays inside that envelope, and the first step and site (in execution
  order) where it leaves it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import xarray as xr

from workbench.analysis.difference import first_true
from workbench.errors import IncomparableRunsError
from workbench.store.records import RunRecords


@dataclass(frozen=True)
class NoiseFloor:
    runs: list[str]
    low: xr.DataArray
    """Smallest value of every statistic per (step, site) over the runs."""
    high: xr.DataArray
    """Largest value."""


def noise_floor(runs: list[RunRecords]) -> NoiseFloor:
    """The envelope of N >= 2 runs of one configuration, on their common steps and sites."""
    if len(runs) < 2:
        raise IncomparableRunsError(f"a noise floor needs at least two runs, got {len(runs)}")
    steps = sorted(set.intersection(*(set(r.steps) for r in runs)))
    sites = [s for s in runs[0].sites if all(s in set(r.sites) for r in runs[1:])]
    if not steps or not sites:
        raise IncomparableRunsError("the runs of a noise floor share no recorded step or site")
    stacked = xr.concat([r.stats.sel(step=steps, site=sites) for r in runs], dim="run")
    return NoiseFloor([r.name for r in runs], stacked.min("run", skipna=False), stacked.max("run", skipna=False))


_EXTREMES = ("min", "max")


@dataclass(frozen=True)
class FloorCheck:
    run: str
    inside: bool
    first_step: int | None
    first_site: str | None
    outside: pd.DataFrame
    """bool (step x site): some statistic of the run lies outside the envelope."""


def leaves_floor(run: RunRecords, floor: NoiseFloor, *, stats: tuple[str, ...] = ("sum_sq", "min", "max"),
                 margin: float = 0.0, rtol: float = 1e-6) -> FloorCheck:
    """Whether ``run`` stays inside ``floor``; the first exit in execution order.

    The envelope is widened by ``margin`` x its width and by ``rtol`` x its scale: where
    all runs of the floor agree bitwise the width is zero, and statistics of the same tensor
    summed in another order (shards merged, another thread split) differ by ~1e-9. The scale of
    a sum is its own magnitude; of an extreme (``min``, ``max``), the tensor's ``absmax``: the
    smallest squared gradient (an ``exp_avg_sq`` minimum of 1e-14) moves by 1e-4 of itself under
    mere rounding while its tensor moves by 1e-8. Whether a change is a bug or rounding is
    ``workbench.analysis.rounding``'s question; this one asks whether a run leaves its repeats.
    """
    steps = [s for s in floor.low["step"].to_numpy().tolist() if s in set(run.steps)]
    sites = [s for s in floor.low["site"].to_numpy().tolist() if s in set(run.sites)]
    if not steps or not sites:
        raise IncomparableRunsError(f"{run.name} shares no recorded step or site with the noise floor")
    low = floor.low.sel(step=steps, site=sites, stat=list(stats))
    high = floor.high.sel(step=steps, site=sites, stat=list(stats))
    own = xr.where(abs(low) > abs(high), abs(low), abs(high))
    absmax = floor.high.sel(step=steps, site=sites, stat="absmax", drop=True)
    extremes = xr.DataArray([s in _EXTREMES for s in stats], dims="stat", coords={"stat": list(stats)})
    slack = margin * (high - low) + rtol * xr.where(extremes, absmax, own)
    value = run.stats.sel(step=steps, site=sites, stat=list(stats))
    out = (value < low - slack) | (value > high + slack) | (value.isnull() != low.isnull())
    outside = out.any("stat").to_pandas()
    first = first_true(outside)
    if first is None:
        return FloorCheck(run.name, True, None, None, outside)
    return FloorCheck(run.name, False, first.step, first.site, outside)

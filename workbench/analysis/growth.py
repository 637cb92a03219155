"""How differences grow and whether they stay inside the noise floor.

* ``amplification``: after two runs first differ, the relative difference of a statistic
  per site and step on a log scale, with a fitted growth rate (decades per step). A
  single rounding difference amplified by chaotic training grows steadily from ~1e-7; a
  systematic change starts large.
* ``noise_floor``: from N runs of one configuration (nondeterministic repeats), the
  envelope [min, max] of every statistic per (step, site).
* ``leaves_floor``: whether another run stays inside that envelope, and the first step
  and site (in execution order) where it leaves it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import xarray as xr

from workbench.analysis.compare import Comparison, IncomparableRunsError
from workbench.analysis.records import RunRecords

PLATEAU_DECADES = 0.5


@dataclass(frozen=True)
class Amplification:
    stat: str
    per_site: pd.DataFrame
    """Index site; columns first_step, initial, final, rate (log10 per step; NaN with < 2 points)."""
    overall: pd.Series
    """Median over sites of the relative difference, per step."""
    rate: float
    """Fitted growth of ``overall`` in log10 per step over the growth phase: from the first divergent
    step until it first comes within ``PLATEAU_DECADES`` of its largest value, when it rose by at
    least twice that in all (else every step). A chaotic amplification saturates; a fit over the
    plateau would report a rate near zero. NaN if unknown."""
    intercept: float = float("nan")
    """log10 of the fitted ``overall`` at step 0: the fit is 10 ** (intercept + rate * step)."""


def _fit(steps: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    """(slope, intercept) of log10(values) against steps over the positive values; NaN with < 2 points."""
    keep = np.isfinite(values) & (values > 0)
    if keep.sum() < 2:
        return float("nan"), float("nan")
    slope, intercept = np.polyfit(steps[keep].astype(float), np.log10(values[keep]), 1)
    return float(slope), float(intercept)


def amplification(result: Comparison, stat: str = "l2") -> Amplification:
    """Growth of ``stat``'s relative difference after ``result.first_step``."""
    rel = pd.DataFrame(result.relative_difference.sel(stat=stat).to_pandas())  # step x site
    rows = []
    for site in rel.columns:
        start = result.frontier.get(site)
        series = rel[site] if start is None else rel[site].loc[start:]
        values = series.to_numpy(dtype=float)
        rows.append({"site": site, "first_step": start,
                     "initial": values[0] if start is not None and len(values) else np.nan,
                     "final": values[-1] if len(values) else np.nan,
                     "rate": _fit(series.index.to_numpy(), values)[0] if start is not None else np.nan})
    per_site = pd.DataFrame(rows).set_index("site")
    overall = rel.median(axis=1, skipna=True)
    if result.first_step is None:
        return Amplification(stat, per_site, overall, float("nan"))
    after = overall.loc[result.first_step:]
    values = after.to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        log = np.log10(np.where(values > 0, values, np.nan))
    finite = log[np.isfinite(log)]
    if finite.size and finite.max() - finite[0] >= 2 * PLATEAU_DECADES:
        # a rise of a decade or more saturates: the growth phase ends within half a decade of the peak
        end = int(np.argmax(log >= finite.max() - PLATEAU_DECADES)) + 1
        after = after.iloc[:max(end, 2)]
    rate, intercept = _fit(after.index.to_numpy(), after.to_numpy(dtype=float))
    return Amplification(stat, per_site, overall, rate, intercept)


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

    The envelope is widened by ``margin`` x its width and by ``rtol`` x its magnitude: where
    all runs of the floor agree bitwise the width is zero, and statistics of the same tensor
    summed in another order (shards merged, another thread split) differ by ~1e-9.
    """
    steps = [s for s in floor.low["step"].to_numpy().tolist() if s in set(run.steps)]
    sites = [s for s in floor.low["site"].to_numpy().tolist() if s in set(run.sites)]
    if not steps or not sites:
        raise IncomparableRunsError(f"{run.name} shares no recorded step or site with the noise floor")
    low = floor.low.sel(step=steps, site=sites, stat=list(stats))
    high = floor.high.sel(step=steps, site=sites, stat=list(stats))
    slack = margin * (high - low) + rtol * xr.where(abs(low) > abs(high), abs(low), abs(high))
    value = run.stats.sel(step=steps, site=sites, stat=list(stats))
    out = (value < low - slack) | (value > high + slack) | (value.isnull() != low.isnull())
    outside = out.any("stat").to_pandas()
    rows = outside.index[outside.any(axis=1)]
    if len(rows) == 0:
        return FloorCheck(run.name, True, None, None, outside)
    first_step = int(rows[0])
    row = outside.loc[first_step]
    return FloorCheck(run.name, False, first_step, str(row.index[row.to_numpy()][0]), outside)

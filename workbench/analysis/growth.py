"""How differences grow.

``amplification``: after two runs first differ, the relative difference of a statistic per site and step on a
log scale, with a fitted growth rate (decades per step). A single rounding difference amplified by chaotic
training grows steadily from ~1e-7; a systematic change starts large. Whether a run stays inside the noise
floor is ``analysis.noise_floor``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import xarray as xr

if TYPE_CHECKING:  # compare builds on growth (a comparison's summary says how fast the gap grows)
    from workbench.analysis.compare import Comparison

MIN_RISE_DECADES = 1.0
"""A saturation is reported only after the difference rose by at least this much."""


@dataclass(frozen=True)
class Amplification:
    stat: str
    per_site: pd.DataFrame
    """Index site; columns first_step, initial, final, rate (log10 per step; NaN with < 2 points)."""
    overall: pd.Series
    """Median over sites of the relative difference, per step."""
    rate: float
    """Growth of ``overall`` in log10 per step over the growth phase (``fit_steps``). NaN if unknown."""
    intercept: float = float("nan")
    """log10 of the fitted ``overall`` at step 0: over ``fit_steps`` the fit is 10 ** (intercept + rate * step)."""
    fit_steps: tuple[int, int] | None = None
    """First and last step the growth fit describes; None without a fit."""
    saturation_step: int | None = None
    """Where the growth ends and the difference stays flat; None when it grows to the last step."""
    plateau: float = float("nan")
    """The level (relative difference) it saturates at; NaN without a saturation."""


def row_nanmedian(values: np.ndarray) -> np.ndarray:
    """``np.nanmedian(values, axis=1)`` without its row-by-row loop where NaNs are present: each row sorted
    (NaN last), the middle of its finite count taken; NaN for a row without a value. Block by block of rows,
    so that no temporary is as large as ``values``."""
    out = np.full(values.shape[0], np.nan)
    if values.shape[1] == 0:
        return out
    rows = max(1, _MEDIAN_BLOCK // values.shape[1])
    for low in range(0, values.shape[0], rows):
        block = values[low:low + rows]
        ordered = np.sort(block, axis=1)
        count = block.shape[1] - np.isnan(block).sum(axis=1)
        at, n = np.arange(len(block)), np.maximum(count, 1)  # a row of NaN only: masked below
        middle = (ordered[at, (n - 1) // 2] + ordered[at, n // 2]) / 2
        out[low:low + rows] = np.where(count > 0, middle, np.nan)
    return out


_MEDIAN_BLOCK = 1 << 16
"""Values per block of ``row_nanmedian``."""
_SLOPE_BLOCK = 1 << 16
"""Cells per block of ``_slopes``: its passes stay in the cache, and no temporary is as large as ``values``."""


def _slopes(steps: np.ndarray, values: np.ndarray, first_row: np.ndarray) -> np.ndarray:
    """Per column of ``values`` (step x site), the least-squares slope of log10(values) against steps over
    its positive values from row ``first_row`` on, every column at once; NaN with < 2 points. The sums of the
    fit are taken block by block of rows (steps centred on their mean, so that they do not cancel)."""
    start = int(first_row.min(initial=values.shape[0]))  # no column looks at the rows before
    values, first_row = values[start:], first_row - start
    x_all = steps[start:].astype(float)
    x_all -= x_all.mean() if x_all.size else 0.0
    n, sum_x, sum_xx, sum_y, sum_xy = (np.zeros(values.shape[1]) for _ in range(5))  # [site] each
    rows = max(1, _SLOPE_BLOCK // max(values.shape[1], 1))
    for low in range(0, values.shape[0], rows):
        block, x = values[low:low + rows], x_all[low:low + rows]  # [step, site], [step]
        with np.errstate(invalid="ignore"):
            keep = (np.arange(low, low + len(block))[:, None] >= first_row[None, :]) & (block > 0) & \
                np.isfinite(block)
        y = np.log10(np.where(keep, block, 1.0))  # 0 where not kept
        kept = keep.astype(float)
        n += kept.sum(axis=0)
        sum_x += x @ kept
        sum_xx += (x * x) @ kept
        sum_y += y.sum(axis=0)
        sum_xy += x @ y
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = (n * sum_xy - sum_x * sum_y) / (n * sum_xx - sum_x * sum_x)
    return np.where(n >= 2, slope, np.nan)


def growth_phase(steps: np.ndarray, values: np.ndarray) -> tuple[float, float, int, int | None]:
    """Fit log10(values) = intercept + rate * min(step, knee): growth, then a plateau from the knee on.

    Every observed step is tried as the knee (least squares each); the best one is a saturation
    when it leaves at least two steps of plateau, fits at least twice as well as one straight
    line, and the difference rose by ``MIN_RISE_DECADES`` or more before it. Returns (rate,
    intercept, last step of the growth fit, saturation step or None); NaN rate with < 2 points.
    """
    keep = np.isfinite(values) & (values > 0)
    x = steps[keep].astype(float)
    y = np.log10(values[keep])
    if x.size < 2:
        return float("nan"), float("nan"), int(steps[-1]) if steps.size else 0, None
    rate, intercept = (float(v) for v in np.polyfit(x, y, 1))
    line_sse = float(np.sum((y - (intercept + rate * x)) ** 2))
    if x.size >= 4:  # the knee (index k) leaves >= 2 plateau points after it: k in 1 .. n - 3
        r, a, sse = _knee_fits(x, y)
        k = 1 + int(np.argmin(sse[1:x.size - 2]))
        if r[k] > 0 and r[k] * (x[k] - x[0]) >= MIN_RISE_DECADES and sse[k] <= 0.5 * line_sse:
            return float(r[k]), float(a[k]), int(x[k]), int(x[k])
    return rate, intercept, int(x[-1]), None


def _knee_fits(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least squares of y = a + r * min(x, x[k]) for every k at once (x ascending): (r, a, sse) per k.

    The sums of the feature min(x, x[k]) are running sums up to k plus x[k] times the count (or the
    sum of y) after it; x and y are centred first so that the sums do not cancel."""
    n = x.size
    x0, y0 = x.mean(), y.mean()
    xc, yc = x - x0, y - y0
    after = n - 1 - np.arange(n)  # points after the knee
    sum_f = np.cumsum(xc) + after * xc
    sum_ff = np.cumsum(xc * xc) + after * xc * xc
    sum_fy = np.cumsum(xc * yc) + xc * (yc.sum() - np.cumsum(yc))
    sum_y, sum_yy = yc.sum(), float(np.sum(yc * yc))
    with np.errstate(invalid="ignore", divide="ignore"):  # k = 0: a constant feature, no slope (NaN)
        r = (n * sum_fy - sum_f * sum_y) / (n * sum_ff - sum_f * sum_f)
        a = (sum_y - r * sum_f) / n
        sse = sum_yy - 2 * a * sum_y - 2 * r * sum_fy + n * a * a + 2 * a * r * sum_f + r * r * sum_ff
        # back to uncentred x and y: y = y0 + a + r * (min(x, x_k) - x0)
        return r, y0 + a - r * x0, np.where(np.isfinite(sse), sse, np.inf)


def amplification(result: Comparison, stat: str = "l2", *, rel: xr.DataArray | None = None) -> Amplification:
    """Growth of ``stat``'s relative difference after ``result.first_step``: how fast (decades per
    step), for how long (until ``saturation_step``) and up to where (``plateau``). ``rel``: that relative
    difference (``Comparison.relative``), where the caller holds it."""
    rel = (result.relative(stat) if rel is None else rel).transpose("step", "site")
    values = np.asarray(rel.to_numpy(), dtype=float)  # [step, site]: no copy of a float array
    steps, sites = rel["step"].to_numpy(), rel.indexes["site"]
    starts = result.frontier.reindex(sites).fillna(-1).astype(int).to_numpy()  # -1: never differs
    diverged = starts >= 0
    first_row = np.searchsorted(steps, np.where(diverged, starts, steps[0]))  # the frontier step's row
    columns = np.arange(values.shape[1])
    per_site = pd.DataFrame({
        "first_step": pd.Series(starts).where(diverged).astype("Int64").to_numpy(),  # NA: never differs
        "initial": np.where(diverged & (first_row < len(steps)),
                            values[np.minimum(first_row, len(steps) - 1), columns], np.nan),
        "final": values[-1] if len(steps) else np.full(values.shape[1], np.nan),
        "rate": np.where(diverged, _slopes(steps, values, np.where(diverged, first_row, len(steps))), np.nan),
    }, index=pd.Index(sites, name="site"))
    overall = pd.Series(row_nanmedian(values), index=pd.Index(steps, name="step"))
    if result.first_step is None:
        return Amplification(stat, per_site, overall, float("nan"))
    after = overall.loc[result.first_step:]
    steps, values = after.index.to_numpy(), after.to_numpy(dtype=float)
    rate, intercept, last, knee = growth_phase(steps, values)
    if not np.isfinite(rate):
        return Amplification(stat, per_site, overall, rate)
    plateau = float(np.nanmedian(values[steps >= knee])) if knee is not None else float("nan")
    return Amplification(stat, per_site, overall, rate, intercept, fit_steps=(int(result.first_step), last),
                         saturation_step=knee, plateau=plateau)

"""The two primitives every comparison of runs is built from.

``first_true(mask)``: the first (step, site) where a step x site mask holds -- the earliest step,
then the first site in the mask's column order, which is the execution order. Two runs first
differ where their fingerprints do; a run first leaves a noise floor, or first holds a NaN, where
those masks first hold.

``relative(x, y)`` (numpy) and ``relative_difference(x, y)`` (xarray, lazy over Dask):
|x - y| / max(|x|, |y|) with the conventions every view shares.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import xarray as xr

from workbench.errors import ArgumentError


@dataclass(frozen=True)
class FirstHit:
    step: int
    site: str
    count: int
    """Sites where the mask holds at ``step``."""


def first_true(mask: pd.DataFrame) -> FirstHit | None:
    """The first (step, site) where ``mask`` (bool, step index x site columns in execution order) is True,
    or None where it never is."""
    values = mask.to_numpy(dtype=bool)
    rows = np.flatnonzero(values.any(axis=1))
    if not len(rows):
        return None
    row = values[rows[0]]
    return FirstHit(int(mask.index[rows[0]]), str(mask.columns[int(np.argmax(row))]), int(row.sum()))


_BLOCK = 1 << 16
"""Elements per block of ``relative``: its dozen passes then run in the cache, not in memory."""


def relative(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|x - y| / max(|x|, |y|) of two arrays (float64, broadcast): 0 where equal (NaN = NaN counts as
    equal), NaN where only one is NaN or both are infinite with different signs."""
    # block by block and in place: this runs over every (step, site) of a statistic whenever one is first shown
    x, y = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    out = np.empty(x.shape, dtype=np.float64)
    flat_x, flat_y, flat_out = x.reshape(-1), y.reshape(-1), out.reshape(-1)  # out: a view (inputs may copy)
    scale, equal, undefined = (np.empty(min(_BLOCK, flat_x.size), dtype=dtype) for dtype in (np.float64, bool, bool))
    for start in range(0, flat_x.size, _BLOCK):
        a, b, diff = flat_x[start:start + _BLOCK], flat_y[start:start + _BLOCK], flat_out[start:start + _BLOCK]
        n = a.size
        s, e, u = scale[:n], equal[:n], undefined[:n]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # inf - inf, x / 0: NaN, as documented
            np.abs(a, out=s)
            np.maximum(s, np.abs(b, out=diff), out=s)
            np.equal(s, 0, out=u)
            np.subtract(a, b, out=diff)
            np.abs(diff, out=diff)
            np.divide(diff, s, out=diff)
        np.copyto(diff, np.nan, where=u)  # both zero: undefined unless equal (below)
        np.equal(a, b, out=e)
        np.isnan(a, out=u)
        u &= np.isnan(b)
        e |= u
        np.copyto(diff, 0.0, where=e)
    return out


def relative_difference(x: xr.DataArray, y: xr.DataArray) -> xr.DataArray:
    """|x - y| / max(|x|, |y|): 0 where equal (NaN = NaN counts as equal), NaN where only one is NaN or
    both are infinite with different signs. Lazy when the inputs are (Dask): computed chunk by chunk."""
    return xr.apply_ufunc(relative, x, y, dask="parallelized", output_dtypes=[np.float64])


def labelled_difference(a: xr.Dataset, b: xr.Dataset) -> xr.Dataset:
    """Two runs' differences, labelled as their ``Run.sites()`` Datasets are, over the steps and sites both
    recorded (in ``a``'s site order): ``relative`` (step, site, stat), ``relative_difference`` of every
    statistic, lazy where the inputs are; ``equal`` (step, site), whether the fingerprints are bitwise
    equal. ``attrs`` names the runs (``a``, ``b``)."""
    missing = [name for name in ("stats", "fingerprint") for ds in (a, b) if name not in ds]
    if missing:
        raise ArgumentError(f"not a run's labelled statistics (Run.sites()): no {missing[0]!r}")
    a, b = xr.align(a[["stats", "fingerprint"]], b[["stats", "fingerprint"]], join="inner",
                    exclude=[d for d in a.dims if d not in ("step", "site", "stat")])
    out = xr.Dataset({"relative": relative_difference(a["stats"], b["stats"]),
                      "equal": a["fingerprint"] == b["fingerprint"]})
    out.attrs = {"a": a.attrs.get("run", "a"), "b": b.attrs.get("run", "b")}
    return out

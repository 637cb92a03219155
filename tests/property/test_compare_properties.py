"""Invariants of ``compare`` over random runs and random injected differences."""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.analysis import RunRecords, compare
from workbench.statistics import STAT_NAMES


def _run(name: str, fingerprints: np.ndarray, stats: np.ndarray) -> RunRecords:
    steps, sites = fingerprints.shape
    names = [f"act:layers.{i}" for i in range(sites)]
    return RunRecords(name, pd.DataFrame(fingerprints, index=pd.Index(range(steps), name="step"), columns=names),
                      xr.DataArray(stats, dims=("step", "site", "stat"),
                                   coords={"step": list(range(steps)), "site": names, "stat": list(STAT_NAMES)}))


@st.composite
def run_pair(draw: st.DrawFn) -> tuple[RunRecords, RunRecords, list[tuple[int, int]]]:
    steps, sites = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    fingerprints = rng.integers(0, 2**63, size=(steps, sites), dtype=np.int64).astype(np.uint64)
    stats = rng.uniform(-2, 2, size=(steps, sites, len(STAT_NAMES)))
    cells = draw(st.lists(st.tuples(st.integers(0, steps - 1), st.integers(0, sites - 1)), max_size=6, unique=True))
    changed_fp, changed_stats = fingerprints.copy(), stats.copy()
    for i, j in cells:
        changed_fp[i, j] ^= np.uint64(1)
        changed_stats[i, j] *= 1.5
    return _run("a", fingerprints, stats), _run("b", changed_fp, changed_stats), cells


@settings(max_examples=60, deadline=None)
@given(run_pair())
def test_first_divergence_and_frontier_are_the_earliest_changed_cells(pair) -> None:  # type: ignore[no-untyped-def]
    a, b, cells = pair
    result = compare(a, b)
    assert result.identical == (not cells)
    assert compare(a, a).identical
    if cells:
        first = min(cells)  # earliest step, then earliest site in execution order
        assert (result.first_step, result.first_site) == (first[0], a.sites[first[1]])
        expected = {a.sites[j]: min(i for i, jj in cells if jj == j) for _, j in cells}
        assert result.frontier.to_dict() == expected
        assert int((~result.equal).to_numpy().sum()) == len(cells)
    swapped = compare(b, a)
    assert (swapped.first_step, swapped.first_site) == (result.first_step, result.first_site)
    rel = result.relative_difference.to_numpy()
    assert np.all((rel >= 0) & (rel <= 1) | np.isnan(rel))

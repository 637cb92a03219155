"""Amplification and the noise floor on synthetic records with known answers."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from tests.unit.test_compare import SITES, perturb, records
from workbench.analysis import IncomparableRunsError, RunRecords, compare
from workbench.analysis.growth import amplification, leaves_floor, noise_floor


def with_stats(run: RunRecords, name: str, stats: xr.DataArray) -> RunRecords:
    return RunRecords(name, run.fingerprints, stats, run.model)


def test_amplification_fits_the_growth_rate() -> None:
    a = records("a", steps=10)
    b = perturb(a, "b", step=2, site="act:embedding")
    # Make the relative L2 difference grow tenfold per step from 1e-10 at step 2.
    stats = b.stats.copy()
    for step in range(2, 10):
        stats.loc[{"step": step, "stat": "l2"}] = a.stats.sel(step=step, stat="l2") * (1 + 1e-10 * 10 ** (step - 2))
    result = amplification(compare(a, with_stats(b, "b", stats)))
    assert result.rate == pytest.approx(1.0, abs=0.01)  # one decade per step
    assert result.per_site.loc["act:embedding", "first_step"] == 2
    assert result.per_site.loc["act:embedding", "rate"] == pytest.approx(1.0, abs=0.01)
    assert result.overall.loc[1] == 0.0


def test_identical_runs_have_no_rate() -> None:
    assert np.isnan(amplification(compare(records("a"), records("b"))).rate)


def test_noise_floor_envelope_and_first_exit_in_execution_order() -> None:
    repeats = [records("r0"), with_stats(records("r1"), "r1", records("r1").stats * 1.01)]
    floor = noise_floor(repeats)
    inside = with_stats(records("x"), "x", records("x").stats * 1.005)
    assert leaves_floor(inside, floor).inside
    stats = records("y").stats.copy()
    stats.loc[{"step": 3, "site": "act:layers.0", "stat": "sum_sq"}] *= 1.5
    stats.loc[{"step": 4, "site": SITES[0], "stat": "max"}] *= 2.0
    check = leaves_floor(with_stats(records("y"), "y", stats), floor)
    assert not check.inside
    assert (check.first_step, check.first_site) == (3, "act:layers.0")


def test_noise_floor_needs_two_runs() -> None:
    with pytest.raises(IncomparableRunsError, match="at least two"):
        noise_floor([records("only")])

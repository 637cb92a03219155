"""Amplification and the noise floor on synthetic records with known answers."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from tests.helpers.records import SITES, perturb, records
from workbench.analysis import RunRecords, compare
from workbench.analysis.growth import amplification, growth_phase
from workbench.analysis.noise_floor import leaves_floor, noise_floor
from workbench.errors import IncomparableRunsError


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


def test_an_extreme_near_zero_is_held_to_its_tensors_scale_not_its_own() -> None:
    # exp_avg_sq's smallest element (1e-14) moves by 1e-4 of itself under rounding; its tensor's absmax is 1e-6
    stats = records("r").stats.copy()
    stats.loc[{"stat": "min"}] = 1e-14
    stats.loc[{"stat": "absmax"}] = 1e-6
    floor = noise_floor([with_stats(records("r"), "r0", stats), with_stats(records("r"), "r1", stats)])
    rounded = stats.copy()
    rounded.loc[{"step": 2, "site": SITES[0], "stat": "min"}] = 1e-14 * (1 + 1e-4)
    assert leaves_floor(with_stats(records("r"), "x", rounded), floor).inside
    moved = stats.copy()
    moved.loc[{"step": 2, "site": SITES[0], "stat": "min"}] = 1e-14 + 1e-10  # 1e-4 of the tensor's scale
    check = leaves_floor(with_stats(records("r"), "y", moved), floor)
    assert (check.inside, check.first_step, check.first_site) == (False, 2, SITES[0])


def test_noise_floor_needs_two_runs() -> None:
    with pytest.raises(IncomparableRunsError, match="at least two"):
        noise_floor([records("only")])


@pytest.mark.parametrize(("rate", "knee", "noise"), [(0.3, 15, 0.0), (0.25, 20, 0.05), (0.5, 8, 0.1)])
def test_growth_then_plateau_is_fitted_over_the_growth_phase_only(rate: float, knee: int, noise: float) -> None:
    steps = np.arange(2, 60)
    log = -10 + rate * (np.minimum(steps, knee) - 2) + np.random.default_rng(0).normal(0, noise, steps.size)
    fitted_rate, intercept, last, saturation = growth_phase(steps, 10.0 ** log)
    assert fitted_rate == pytest.approx(rate, rel=0.1)
    assert saturation == pytest.approx(knee, abs=1) and last == saturation
    assert intercept + fitted_rate * saturation == pytest.approx(-10 + rate * (knee - 2), abs=0.3)


def test_steady_growth_has_no_plateau_and_a_flat_difference_no_saturation() -> None:
    steps = np.arange(0, 40)
    rate, _, last, saturation = growth_phase(steps, 10.0 ** (-9 + 0.2 * steps))
    assert rate == pytest.approx(0.2) and saturation is None and last == 39
    flat = growth_phase(steps, np.full(steps.size, 3e-4))  # a systematic change: large from the start
    assert flat[0] == pytest.approx(0.0, abs=1e-9) and flat[3] is None


def test_amplification_reports_where_the_growth_saturates_and_at_what_level() -> None:
    a = records("a", steps=30)
    b = perturb(a, "b", step=0, site=SITES[0])
    stats = b.stats.copy()
    for step in range(30):  # every site: 1e-10, a decade every 2 steps up to step 10, then flat at 1e-5
        factor = 1 + 1e-10 * 10 ** (min(step, 10) / 2)
        stats.loc[{"step": step, "stat": "l2"}] = a.stats.sel(step=step, stat="l2") * factor
    growth = amplification(compare(a, with_stats(b, "b", stats)))
    assert growth.rate == pytest.approx(0.5, rel=0.05)
    assert growth.saturation_step == 10 and growth.fit_steps == (0, 10)
    assert growth.plateau == pytest.approx(1e-5, rel=0.05)


def test_the_slopes_of_every_site_at_once_are_those_fitted_site_by_site(monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.analysis import growth

    rng = np.random.default_rng(4)
    steps = np.arange(1000, 1000 + 10 * 37, 10)
    values = 10.0 ** (rng.uniform(-0.1, 0.3, 9)[None, :] * (steps[:, None] - 1000) / 10 - 12
                      + rng.normal(0, 0.2, (37, 9)))
    values[5, 0], values[6, 1], values[7, 2], values[8, 3] = np.nan, 0.0, -1.0, np.inf  # left out of the fits
    first_row = np.array([0, 3, 10, 20, 35, 36, 37, 2, 0])  # 36: one point, 37: none
    monkeypatch.setattr(growth, "_SLOPE_BLOCK", 20)  # 2 rows a block, the last one short
    slopes = growth._slopes(steps, values, first_row)
    for site in range(values.shape[1]):
        rows = np.arange(len(steps)) >= first_row[site]
        keep = rows & np.isfinite(values[:, site]) & (values[:, site] > 0)
        if keep.sum() < 2:
            assert np.isnan(slopes[site])
            continue
        expected = np.polyfit(steps[keep], np.log10(values[keep, site]), 1)[0]
        assert slopes[site] == pytest.approx(expected, rel=1e-9, abs=1e-12), site


def test_row_medians_are_numpys() -> None:
    from workbench.analysis import growth

    rng = np.random.default_rng(5)
    values = rng.standard_normal((40, 7))
    values[rng.random((40, 7)) < 0.3] = np.nan
    values[0], values[1, :3], values[2, 0], values[3, 1:3] = np.nan, np.inf, -np.inf, [np.inf, -np.inf]
    expected = np.array([np.nanmedian(row) if not np.isnan(row).all() else np.nan for row in values])
    for shown in (values, values[:, :1], values[4:5], np.nan_to_num(values, nan=0.5)):
        got = growth.row_nanmedian(shown)
        want = expected if shown is values else np.array(
            [np.nanmedian(row) if not np.isnan(row).all() else np.nan for row in shown])
        np.testing.assert_array_equal(got, want)
    assert growth.row_nanmedian(values[:, :0]).shape == (40,)

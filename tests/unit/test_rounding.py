"""Bug or rounding (``analysis.rounding``) on runs whose answer is known: tensors given one rounding's noise that
grows with the steps (the band runs, and held-out runs drawn the same way) and a bug of one site from one step on."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from workbench.analysis.rounding import MAX_MARGIN, MIN_MARGIN, analytic_bound, analytic_check, judge, rounding_band
from workbench.errors import IncomparableRunsError
from workbench.statistics import STAT_NAMES, fingerprint_reference, stats_reference
from workbench.store.records import RunRecords

SITES = ["param:layers.0.mlp.linear_fc1.weight", "act:layers.0.self_attention", "act:layers.0.mlp", "act:layers.0",
         "act_grad:layers.0", "grad:layers.0.mlp.linear_fc1.weight", "update:layers.0.mlp.linear_fc1.weight"]
STEPS = 5
U = 2.0 ** -24


def tensors(seed: int = 0) -> dict[tuple[int, str], np.ndarray]:
    rng = np.random.default_rng(seed)
    return {(step, site): rng.standard_normal(4096).astype(np.float32) for step in range(STEPS) for site in SITES}


def run_of(name: str, values: dict[tuple[int, str], np.ndarray]) -> RunRecords:
    stats = np.array([[stats_reference(values[step, site]) for site in SITES] for step in range(STEPS)])
    prints = [[fingerprint_reference(values[step, site]) for site in SITES] for step in range(STEPS)]
    return RunRecords(name, pd.DataFrame(np.array(prints, dtype=np.uint64), index=pd.Index(range(STEPS), name="step"),
                                         columns=SITES),
                      xr.DataArray(stats, dims=("step", "site", "stat"),
                                   coords={"step": list(range(STEPS)), "site": SITES, "stat": list(STAT_NAMES)}))


def rounded(reference: dict[tuple[int, str], np.ndarray], seed: int) -> dict[tuple[int, str], np.ndarray]:
    """The reference with rounding noise of one unit at step 0, growing 4-fold a step (training amplifies it);
    parameters are equal at step 0 (the same initialisation)."""
    rng = np.random.default_rng(1000 + seed)
    out = {}
    for (step, site), x in reference.items():
        size = 0.0 if (step == 0 and site.startswith("param:")) else U * 4.0 ** step
        out[step, site] = (x.astype(np.float64) * (1 + size * rng.uniform(-1, 1, x.shape))).astype(np.float32)
    return out


@pytest.fixture(scope="module")
def corpus() -> dict[str, RunRecords]:
    reference = tensors()
    runs = {"ref": run_of("ref", reference)}
    runs.update({f"p{i}": run_of(f"p{i}", rounded(reference, i)) for i in range(12)})
    bug = rounded(reference, 99)
    for step in range(2, STEPS):  # a wrong scale in the MLP from step 2 on, and all that follows it in the step
        for site in SITES[2:]:
            bug[step, site] = bug[step, site] * np.float32(1 + 2.0 ** -10)
    runs["bug"] = run_of("bug", bug)
    return runs


def test_held_out_runs_of_the_same_rounding_stay_within_the_band(corpus: dict[str, RunRecords]) -> None:
    band = rounding_band(corpus["ref"], [corpus[f"p{i}"] for i in range(6)])
    assert band.margin >= MIN_MARGIN
    for i in range(6, 12):
        verdict = judge(corpus[f"p{i}"], corpus["ref"], band)
        assert verdict.within, verdict.summary()
        assert 0 < verdict.worst_ratio <= 1 and verdict.first_step is None
    assert "within rounding" in verdict.summary()


def test_a_bug_is_beyond_rounding_at_its_step_and_first_site(corpus: dict[str, RunRecords]) -> None:
    band = rounding_band(corpus["ref"], [corpus[f"p{i}"] for i in range(6)])
    verdict = judge(corpus["bug"], corpus["ref"], band)
    assert not verdict.within
    assert (verdict.first_step, verdict.first_site) == (2, "act:layers.0.mlp")
    assert verdict.first_ratio > 10, verdict.summary()
    assert "beyond rounding from step 2: look at act:layers.0.mlp" in verdict.summary()
    assert json.loads(json.dumps(verdict.to_dict()))["verdict"] == "beyond rounding"


def test_a_site_no_band_run_changed_is_beyond_at_any_difference_past_one_unit(corpus: dict[str, RunRecords]) -> None:
    # the parameters at step 0 are bitwise equal in every band run: their band is one unit in the last place
    band = rounding_band(corpus["ref"], [corpus[f"p{i}"] for i in range(3)])
    reference = tensors()
    shifted = dict(reference)
    site = SITES[0]
    shifted[0, site] = reference[0, site] * np.float32(1 + 2.0 ** -12)
    verdict = judge(run_of("shifted", shifted), corpus["ref"], band)
    assert (verdict.first_step, verdict.first_site) == (0, site)
    one_unit = dict(reference)
    x = reference[0, site].copy()
    x[0] = np.nextafter(x[0], np.float32(np.inf))  # one element, one unit: what another reduction order can do
    one_unit[0, site] = x
    assert judge(run_of("one-unit", one_unit), corpus["ref"], band).ratio.iloc[0, 0] <= 1


def test_the_optimizers_extremes_are_not_judged_only_its_mean(corpus: dict[str, RunRecords]) -> None:
    band = rounding_band(corpus["ref"], [corpus[f"p{i}"] for i in range(4)])
    reference = tensors()
    jumped = rounded(reference, 50)
    site = "update:layers.0.mlp.linear_fc1.weight"
    x = jumped[3, site].copy()
    x[int(np.argmax(x))] *= 1.001  # Adam's element whose gradient cancelled: the largest update moves alone
    jumped[3, site] = x
    assert judge(run_of("jumped", jumped), corpus["ref"], band).within
    scaled = rounded(reference, 51)
    scaled[3, site] = scaled[3, site] * np.float32(1.05)  # the whole update scaled: its mean moves (by 1e-3 of the
    # RMS here, where the values are centred: a finer change of the update shows in the next step's parameters)
    verdict = judge(run_of("scaled", scaled), corpus["ref"], band)
    assert (verdict.first_step, verdict.first_site) == (3, site)


def test_the_margin_comes_from_leaving_each_band_run_out(corpus: dict[str, RunRecords]) -> None:
    band = rounding_band(corpus["ref"], [corpus[f"p{i}"] for i in range(4)])
    assert list(band.calibration["run"]) == ["p0", "p1", "p2", "p3"]
    assert (band.calibration["worst"] > 0).all()
    assert band.margin == max(MIN_MARGIN, 2 * band.calibration["worst"].max())
    assert band.steps == list(range(STEPS)) and band.sites == SITES


def test_a_band_of_one_run_or_of_another_reference_is_refused(corpus: dict[str, RunRecords]) -> None:
    with pytest.raises(IncomparableRunsError, match="at least two band runs"):
        rounding_band(corpus["ref"], [corpus["p0"]])
    with pytest.raises(IncomparableRunsError, match="precision 'fp64'"):
        rounding_band(corpus["ref"], [corpus["p0"], corpus["p1"]], precision="fp64")
    band = rounding_band(corpus["ref"], [corpus["p0"], corpus["p1"]])
    with pytest.raises(IncomparableRunsError, match="the band is ref's, not p2's"):
        judge(corpus["bug"], corpus["p2"], band)


def test_a_coarser_precision_makes_a_wider_band(corpus: dict[str, RunRecords]) -> None:
    runs = [corpus[f"p{i}"] for i in range(3)]
    fine, coarse = rounding_band(corpus["ref"], runs), rounding_band(corpus["ref"], runs, precision="bf16")
    assert (coarse.band >= fine.band).all() and coarse.band.min() == 2 * 2.0 ** -8
    assert judge(corpus["bug"], corpus["ref"], coarse).within  # 2**-10 is within bf16's rounding


def test_replicas_that_parted_are_beyond_rounding_at_their_step_and_site(corpus: dict[str, RunRecords]) -> None:
    band = rounding_band(corpus["ref"], [corpus[f"p{i}"] for i in range(4)])
    parted = {"step": 1, "site": "grad:layers.0.mlp.linear_fc1.weight", "tp_rank": 1}
    verdict = judge(corpus["p11"], corpus["ref"], band, replicas_parted=parted)  # within the band, but parted
    assert (verdict.within, verdict.first_step, verdict.first_site, verdict.parted_rank) == \
        (False, 1, "grad:layers.0.mlp.linear_fc1.weight", 1)
    assert "whose copy on TP rank 1 differs from TP rank 0's" in verdict.summary()
    assert json.loads(json.dumps(verdict.to_dict()))["first_ratio"] == "inf"
    # a site beyond the band before the parting keeps the verdict where it was
    bug = judge(corpus["bug"], corpus["ref"], band, replicas_parted={**parted, "step": 3})
    assert (bug.first_step, bug.first_site, bug.parted_rank) == (2, "act:layers.0.mlp", None)


def test_the_analytic_bound_cross_checks_the_first_steps_gradients(corpus: dict[str, RunRecords]) -> None:
    # Megatron-LM's constants (k = 4, C = 1.03) and machine epsilon: deeper layers are allowed more
    assert analytic_bound(1) == pytest.approx(4 * 1.03 * 2.0 ** -23)
    assert analytic_bound(3, "bf16") == pytest.approx(4 * 1.03 ** 3 * 2.0 ** -7)
    assert analytic_bound(3, "bf16") > analytic_bound(3) > analytic_bound(1)
    held = analytic_check(corpus["p7"], corpus["ref"])
    assert list(held["site"]) == ["grad:layers.0.mlp.linear_fc1.weight"] and not held["beyond"].any()
    assert held.loc[0, "depth"] == 1 and 0 < held.loc[0, "norm_change"] < held.loc[0, "bound"]
    reference = tensors()
    moved = rounded(reference, 60)
    site = "grad:layers.0.mlp.linear_fc1.weight"
    moved[0, site] = moved[0, site] * np.float32(1 + 2.0 ** -12)
    check = analytic_check(run_of("moved", moved), corpus["ref"])
    assert check["beyond"].tolist() == [True]
    band = rounding_band(corpus["ref"], [corpus[f"p{i}"] for i in range(4)])
    verdict = judge(run_of("moved", moved), corpus["ref"], band)
    assert verdict.to_dict()["analytic_beyond"] == [site] and "1 of 1 gradients" in verdict.summary()


def test_a_band_whose_runs_disagree_far_beyond_rounding_gives_no_verdict(corpus: dict[str, RunRecords]) -> None:
    # one band run took another path at step 3 (a MoE token routed to another expert): its left-out ratio, and so
    # the margin, is far past MAX_MARGIN; a tolerance that wide would pass the bug
    reference = tensors()
    strayed = rounded(reference, 70)
    strayed[3, "act:layers.0"] = strayed[3, "act:layers.0"] * np.float32(1.01)
    band = rounding_band(corpus["ref"], [corpus["p0"], corpus["p1"], run_of("strayed", strayed)])
    assert band.margin > MAX_MARGIN
    verdict = judge(corpus["bug"], corpus["ref"], band)
    assert (verdict.resolved, verdict.words, verdict.to_dict()["verdict"]) == (False, "unresolved", "unresolved")
    assert "unresolved: the band's runs disagree with one another" in verdict.summary()

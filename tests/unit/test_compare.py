"""compare and golden_check on synthetic records with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.helpers.records import SITES, perturb, records
from workbench.analysis import RunRecords, compare, golden_check
from workbench.errors import IncomparableRunsError


def test_identical_runs_compare_identical() -> None:
    result = compare(records("a"), records("b"))
    assert result.identical and result.first_step is None and result.first_site is None
    assert result.origin_sites == [] and result.frontier.empty
    assert len(result.common_steps) == 6 and result.common_sites == SITES
    assert float(result.relative_difference.max()) == 0.0


def test_difference_injected_at_a_known_step_and_site_is_found_there() -> None:
    a = records("a")
    b = perturb(a, "b", step=3, site="act:layers.0.mlp")
    result = compare(a, b)
    assert not result.identical
    assert result.first_step == 3 and result.first_site == "act:layers.0.mlp"
    assert result.origin_sites == ["act:layers.0.mlp"]  # everything after it inherited the difference
    assert result.frontier["act:layers.0.mlp"] == 3
    assert result.frontier["param:embedding.word_embeddings.weight"] == 4  # params change from the next step
    assert "act:embedding" not in result.frontier or result.frontier["act:embedding"] == 4
    rel = result.relative_difference.sel(stat="l2")
    assert float(rel.sel(step=2).max()) == 0.0
    assert float(rel.sel(step=3, site="act:layers.0.mlp")) == pytest.approx(0.001 / 1.001)


def test_two_independent_origins_in_one_step() -> None:
    a = records("a")
    only_two = perturb(perturb(a, "x", step=2, site="act:embedding", later=False), "b", step=2,
                       site="grad:layers.0.mlp.linear_fc1.weight", later=False)
    result = compare(a, only_two)
    assert result.first_site == "act:embedding"
    assert result.origin_sites == ["act:embedding", "grad:layers.0.mlp.linear_fc1.weight"]


def test_a_permutation_is_detected_through_fingerprints() -> None:
    a = records("a")
    b = records("b")
    swapped = b.fingerprints.copy()
    swapped.loc[4, "act:layers.0"] = np.uint64(int(swapped.loc[4, "act:layers.0"]) + 1)  # any change of bits
    result = compare(a, RunRecords("b", swapped, b.stats, b.model))
    assert (result.first_step, result.first_site) == (4, "act:layers.0")


def test_alignment_reports_what_it_dropped() -> None:
    a = records("a", steps=6)
    b = records("b", steps=4, sites=SITES[:-1] + ["grad:extra"])
    result = compare(a, b)
    assert result.common_steps == [0, 1, 2, 3]
    assert result.only_in_a == {"steps": [4, 5], "sites": [SITES[-1]]}
    assert result.only_in_b == {"steps": [], "sites": ["grad:extra"]}
    assert set(result.to_dict()) >= {"identical", "first_step", "first_site", "origin_sites", "common_steps",
                                     "common_sites"}


def test_runs_that_cannot_be_compared() -> None:
    with pytest.raises(IncomparableRunsError, match="model.hidden_size"):
        compare(records("a", model={"hidden_size": 64}), records("b", model={"hidden_size": 128}))
    late = records("late")
    late = RunRecords("late", late.fingerprints.set_axis(range(10, 16)), late.stats.assign_coords(step=range(10, 16)))
    with pytest.raises(IncomparableRunsError, match="no recorded step in common"):
        compare(records("a"), late)
    with pytest.raises(IncomparableRunsError, match="no site in common"):
        compare(records("a", sites=["act:x"]), records("b", sites=["act:y"]))


def test_running_store_gives_a_warning() -> None:
    running = records("r")
    running = RunRecords("r", running.fingerprints, running.stats, running.model, status="running")
    assert any("running" in w for w in compare(records("a"), running).warnings)


def test_nan_statistics_do_not_become_wrong_answers() -> None:
    a = records("a")
    stats = a.stats.copy()
    stats.loc[{"step": 1, "site": "act:embedding"}] = np.nan
    both_nan = compare(RunRecords("a", a.fingerprints, stats, a.model), RunRecords("b", a.fingerprints, stats, a.model))
    assert float(both_nan.relative_difference.sel(step=1, site="act:embedding").max()) == 0.0
    one_nan = compare(a, RunRecords("b", a.fingerprints, stats, a.model))
    assert np.isnan(one_nan.relative_difference.sel(step=1, site="act:embedding", stat="sum"))


def scaled_values(run: RunRecords, name: str, step: int, site: str, factor: float) -> RunRecords:
    """A copy of ``run`` whose value statistics (not its counts) of ``site`` are scaled from ``step`` on."""
    stats = run.stats.copy()
    values = ["sum", "sum_sq", "min", "max", "absmax", "l2"]
    selection = {"step": [s for s in run.steps if s >= step], "site": site, "stat": values}
    stats.loc[selection] = stats.sel(selection) * factor
    fingerprints = run.fingerprints.copy()
    for s in selection["step"]:
        fingerprints.loc[s, site] = np.uint64(int(fingerprints.loc[s, site]) ^ 1)
    return RunRecords(name=name, fingerprints=fingerprints, stats=stats, model=run.model)


def test_golden_check_exact_and_with_tolerance() -> None:
    golden = records("golden")
    assert golden_check(records("golden"), golden).passed
    drifted = scaled_values(golden, "run", step=2, site="loss:cross_entropy", factor=1 + 1e-9)
    exact = golden_check(drifted, golden, steps=6)
    assert not exact.passed
    assert exact.differences[0].step == 2 and exact.differences[0].site == "loss:cross_entropy"
    assert golden_check(drifted, golden, steps=2).passed  # the difference starts at step 2
    assert golden_check(drifted, golden, rtol=1e-6).passed
    far = scaled_values(golden, "run", step=1, site="act:embedding", factor=1.1)
    tolerant = golden_check(far, golden, rtol=1e-6)
    assert not tolerant.passed and "of the site's" in tolerant.differences[0].detail
    assert (tolerant.differences[0].step, tolerant.differences[0].site) == (1, "act:embedding")
    assert "FAILED" in tolerant.summary()
    counted = golden.stats.copy()
    counted.loc[{"step": 4, "site": SITES[3], "stat": "nan"}] += 1
    nan_count = golden_check(RunRecords("run", golden.fingerprints, counted, golden.model), golden, rtol=0.5)
    assert [(d.step, d.site, d.detail) for d in nan_count.differences] == [(4, SITES[3], "nan count differs")]


def test_a_tolerance_is_measured_against_the_sites_own_scale() -> None:
    golden = records("golden")
    stats = golden.stats.copy()
    site = "grad:layers.0.mlp.linear_fc1.weight"
    # A minimum next to zero in a tensor whose values reach 2: the minimum moves by 50 % of itself,
    # by 5e-7 of the tensor's absmax.
    stats.loc[{"site": site, "stat": "min"}] = 1e-6
    golden = RunRecords("golden", golden.fingerprints, stats, golden.model)
    moved = stats.copy()
    moved.loc[{"step": 3, "site": site, "stat": "min"}] = 1.5e-6
    run = RunRecords("run", golden.fingerprints.copy(), moved, golden.model)
    run.fingerprints.loc[3, site] ^= np.uint64(1)
    assert not golden_check(run, golden).passed
    assert golden_check(run, golden, rtol=1e-6).passed
    strict = golden_check(run, golden, rtol=1e-7)
    assert [(d.step, d.site) for d in strict.differences] == [(3, site)] and "absmax" in strict.differences[0].detail


def test_golden_check_holds_loss_and_grad_norm_like_megatron() -> None:
    golden = records("golden")
    steps = pd.Index(golden.steps, name="step")
    loss = pd.DataFrame({"loss": np.linspace(10.0, 8.0, len(steps)), "grad_norm": 1.0}, index=steps)
    with_scalars = RunRecords("golden", golden.fingerprints, golden.stats, golden.model, scalars=loss)
    assert golden_check(RunRecords("run", golden.fingerprints, golden.stats, golden.model, scalars=loss.copy()),
                        with_scalars).passed
    off = loss.copy()
    off.loc[3, "loss"] += 0.02  # 0.2 % of the mean loss (9.0)
    run = RunRecords("run", golden.fingerprints, golden.stats, golden.model, scalars=off)
    exact = golden_check(run, with_scalars)
    assert [(d.step, d.site) for d in exact.differences] == [(3, "loss")] and "bitwise" in exact.differences[0].detail
    assert golden_check(run, with_scalars, rtol=0.003).passed
    assert [(d.step, d.site) for d in golden_check(run, with_scalars, rtol=0.002).differences] == [(3, "loss")]
    assert exact.scalars == ("loss", "grad_norm") and "loss, grad_norm" in exact.summary()
    no_scalars = golden_check(RunRecords("run", golden.fingerprints, golden.stats, golden.model), with_scalars)
    assert {(d.site, d.detail) for d in no_scalars.differences} == {("loss", "not recorded by the run"),
                                                                    ("grad_norm", "not recorded by the run")}


def test_golden_check_fails_when_the_run_recorded_less() -> None:
    golden = records("golden")
    shorter = records("golden", steps=3, sites=SITES[:-1])
    check = golden_check(shorter, golden)
    details = {d.detail for d in check.differences}
    assert "step not recorded by the run" in details and "site not recorded by the run" in details


def test_study_findings_name_identical_repeats_and_first_differences() -> None:
    from workbench.analysis.findings import study_findings

    det = records("det-r0")
    runs = {"det-r0": det, "det-r1": RunRecords("det-r1", det.fingerprints, det.stats, det.model),
            "nondet-r0": det,
            "nondet-r1": perturb(det, "nondet-r1", step=1, site="grad:embedding.word_embeddings.weight"),
            "tp2": perturb(det, "tp2", step=0, site="act:layers.0.mlp", factor=1.01)}
    lines = study_findings(runs, reference="det-r0", repeats=[["det-r0", "det-r1"], ["nondet-r0", "nondet-r1"]])
    assert lines[0].startswith("repeats det-r0 vs det-r1: bitwise identical")
    assert "first differ at step 1, site grad:embedding.word_embeddings.weight" in lines[1]
    assert lines[2].startswith("nondet-r0 vs det-r0: bitwise identical")  # a group's first run, against the reference
    assert lines[3].startswith("tp2 vs det-r0: first differ at step 0, site act:layers.0.mlp")
    assert "nondeterministic repeats:" in lines[3]
    assert len(lines) == 4  # no repeat is compared with the reference: det-r1 and nondet-r1 were, with their first


def test_the_relative_difference_block_by_block_is_the_formula_everywhere() -> None:
    from workbench.analysis.difference import _BLOCK, relative

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, _BLOCK + 17))  # several blocks and a short last one
    y = x + rng.standard_normal(x.shape) * 1e-3
    specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1.0])
    for array in (x, y):
        cells = rng.integers(0, array.size, 5000)
        array.reshape(-1)[cells] = rng.choice(specials, cells.size)
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = np.abs(x - y) / np.maximum(np.abs(x), np.abs(y))
    expected[(x == y) | (np.isnan(x) & np.isnan(y))] = 0.0
    np.testing.assert_array_equal(relative(x, y), expected)
    np.testing.assert_array_equal(relative(x[:, ::2], y[:, ::2]), expected[:, ::2])  # strided inputs


def test_a_distributed_optimizer_run_is_compared_with_its_plain_twin_and_the_optimizer_named_first() -> None:
    """A run that differs from another of the folder only in how the optimizer's work is shared is compared with
    it too; the line names the settings, and that every site before the optimizer's agrees at the first step."""
    from workbench.analysis.findings import study_findings

    sites = [*SITES, "exp_avg:embedding.word_embeddings.weight", "update:embedding.word_embeddings.weight"]
    det = records("det", sites=sites)
    plain = perturb(det, "dp2", step=0, site="grad:embedding.word_embeddings.weight")
    zero1 = perturb(plain, "dp2-zero1", step=0, site="exp_avg:embedding.word_embeddings.weight")
    base = {"name": "x", "layout": {"dp": 2}, "optim": {"clip_grad": 1.0, "use_distributed_optimizer": False}}
    configs = {"det": {**base, "layout": {"dp": 1}}, "dp2": base,
               "dp2-zero1": {**base, "name": "y", "optim": {"clip_grad": 1.0, "use_distributed_optimizer": True,
                                                            "overlap_grad_reduce": True}}}
    runs = {"det": det, "dp2": plain, "dp2-zero1": zero1}
    lines = study_findings(runs, reference="det", repeats=[], configs=configs)
    assert len(lines) == 3 and lines[2].startswith(
        "dp2-zero1 vs dp2: first differ at step 0, site exp_avg:embedding.word_embeddings.weight")
    assert ("the configs differ in: optim.overlap_grad_reduce True vs absent; optim.use_distributed_optimizer "
            "True vs False") in lines[2]
    assert "every forward, backward and reduced-gradient site agrees at step 0" in lines[2]
    assert "gradient norm" in lines[2]
    # a run differing in anything else as well has no twin; without configs nothing is added
    configs["dp2"] = {**base, "seed": 7}
    assert len(study_findings(runs, reference="det", repeats=[], configs=configs)) == 2
    assert len(study_findings(runs, reference="det", repeats=[])) == 2

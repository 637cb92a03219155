"""analysis.live: a reference compared flush by flush, with the semantics of the check after the run; and the
references it refuses before the first step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.analysis import compare
from workbench.analysis.golden_values import GoldenValues, weights_fingerprints
from workbench.analysis.live import LiveReference
from workbench.recorder.reference import load_reference
from workbench.statistics import STAT_NAMES
from workbench.store.reader import open_run
from workbench.store.synthetic import write_synthetic_run


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("live")
    return (write_synthetic_run(root / "ref", steps=10, sites=12),
            write_synthetic_run(root / "late", steps=10, sites=12, diverge_at=(5, 7), initial_difference=1e-5))


def _flushes(run: Path, every: int = 3):  # type: ignore[no-untyped-def]
    """The candidate's rows as the recorder hands them over: (steps, sites, fingerprints, stats) per flush."""
    records = open_run(run).records()
    fingerprints = records.fingerprints.to_numpy(dtype=np.uint64)
    stats = np.asarray(records.stats.sel(stat=list(STAT_NAMES)).transpose("step", "site", "stat").to_numpy(), float)
    for start in range(0, len(records.steps), every):
        rows = slice(start, start + every)
        yield records.steps[rows], records.sites, fingerprints[rows], stats[rows]


def _first(live: LiveReference, run: Path):  # type: ignore[no-untyped-def]
    for steps, sites, fingerprints, stats in _flushes(run):
        found = live.sites(steps, sites, fingerprints, stats)
        if found is not None:
            return found, steps
    return None, None


def test_the_first_departing_site_in_execution_order_as_compare_finds_it(pair: tuple[Path, Path]) -> None:
    ref, late = pair
    live = load_reference(ref)
    departure, flushed = _first(live, late)
    expected = compare(open_run(ref).records(), open_run(late).records())
    assert departure is not None and (departure.step, departure.site) == (expected.first_step, expected.first_site)
    assert flushed == [3, 4, 5] and departure.reference == open_run(ref).run_id  # found in the flush holding it
    assert _first(load_reference(ref), ref) == (None, None)  # a bitwise twin never departs


def test_a_tolerance_departs_only_beyond_it(pair: tuple[Path, Path]) -> None:
    ref, late = pair
    assert _first(load_reference(ref, rtol=1e-2), late) == (None, None)  # 1e-5 of each value, growing slowly
    departure, _ = _first(load_reference(ref, rtol=1e-7), late)
    assert departure is not None and departure.step == 5 and "rtol 1e-07" in departure.detail


def test_scalars_depart_bitwise_or_beyond_their_tolerance(pair: tuple[Path, Path]) -> None:
    ref, _ = pair
    scalars = open_run(ref).scalars
    live = load_reference(ref)
    for step in range(3):
        assert live.scalars(step, scalars.loc[step].to_dict()) is None
    row = {**scalars.loc[3].to_dict(), "step_time": 99.0}  # a timing never departs
    assert live.scalars(3, row) is None
    row["loss"] = float(np.nextafter(row["loss"], np.inf))
    found = live.scalars(3, row)
    assert found is not None and (found.step, found.site) == (3, "loss") and "bitwise" in found.detail
    tolerant = load_reference(ref, rtol=1e-6)
    assert tolerant.scalars(0, {**scalars.loc[0].to_dict(), "loss": scalars.at[0, "loss"] * (1 + 1e-9)}) is None


def test_a_golden_file_departs_at_the_weights_that_differ(pair: tuple[Path, Path]) -> None:
    ref, late = pair
    weights = weights_fingerprints(open_run(ref).fingerprints())
    golden = GoldenValues(source="golden.json", format="workbench", scalars=pd.DataFrame(index=weights.index),
                          weights=weights)
    live = LiveReference.of_golden(golden)
    departure, _ = _first(live, late)
    late_weights = weights_fingerprints(open_run(late).fingerprints())
    first = int(next(s for s in weights.index if weights[s] != late_weights[s]))
    assert departure is not None and (departure.step, departure.site) == (first, "weights")
    assert _first(LiveReference.of_golden(golden, rtol=1e-6), late) == (None, None)  # no tolerance for a hash


def test_megatron_s_approximate_test_lets_its_allowance_through() -> None:
    loss = pd.Series(np.linspace(5.0, 1.0, 200), index=range(200))
    golden = GoldenValues(source="golden_values.json", format="megatron", scalars=pd.DataFrame({"loss": loss}))
    exact = LiveReference.of_golden(golden)
    assert exact.scalars(0, {"loss": float(loss[0]) + 4e-6}) is None  # rounded to 5 decimals: equal
    assert exact.scalars(1, {"loss": float(loss[1]) + 1e-3}) is not None
    approximate = LiveReference.of_golden(golden, rtol=1e-6)  # 200 steps: 2 may fail
    assert approximate.scalars(0, {"loss": 9.0}) is None and approximate.scalars(1, {"loss": 9.0}) is None
    third = approximate.scalars(2, {"loss": 9.0})
    assert third is not None and third.step == 2 and "3 steps failed, 2 allowed" in third.detail


def test_references_that_cannot_serve_are_refused(pair: tuple[Path, Path]) -> None:
    ref, _ = pair
    live = load_reference(ref)
    model = open_run(ref).manifest.model
    assert model is not None
    assert live.refusal(model=model.shape(), steps=range(10)) is None
    assert "another model (hidden_size=" in str(live.refusal(model={**model.shape(), "hidden_size": 8},
                                                             steps=range(10)))
    assert "from step 10" in str(live.refusal(model=model.shape(), steps=range(12)))
    assert live.refusal(model=model.shape(), steps=range(12), recorded=list(range(10))) is None  # sites: 10 steps
    assert "did not record 1 of the run's sites" in str(live.refusal(model=model.shape(), steps=range(10),
                                                                     sites=[*live.site_names, "act:extra"]))

"""Anomaly rules on synthetic runs with a known answer."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.helpers.records import SITES, records
from workbench.analysis import RunRecords
from workbench.analysis.anomalies import AnomalyRules, find_anomalies
from workbench.errors import ConfigError


def clean(rec: RunRecords):  # type: ignore[no-untyped-def]
    """The statistics of ``rec`` with no NaN or Inf counted (the synthetic records count some)."""
    stats = rec.stats.copy()
    stats.loc[{"stat": ["nan", "inf"]}] = 0.0
    return stats


def scalars(steps: int = 40, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"loss": 3.0 - 0.01 * np.arange(steps) + 0.01 * rng.standard_normal(steps),
                         "grad_norm": 1.0 + 0.05 * rng.standard_normal(steps)},
                        index=pd.Index(range(steps), name="step"))


def test_a_clean_run_has_no_anomalies() -> None:
    assert find_anomalies(scalars()).empty


def test_loss_spike_and_gradient_rules_fire_at_the_injected_steps() -> None:
    run = scalars()
    run.loc[25, "loss"] += 1.0
    run.loc[30, "grad_norm"] = 50.0
    run.loc[35, "grad_norm"] = 1e-4
    found = find_anomalies(run)
    assert list(zip(found["step"], found["rule"])) == [(25, "loss_spike"), (30, "grad_explode"), (35, "grad_vanish")]
    # a robust baseline: the spike at 25 does not hide a second one five steps later
    run.loc[30, "loss"] += 1.0
    assert (30, "loss_spike") in set(zip(find_anomalies(run)["step"], find_anomalies(run)["rule"]))


def test_first_nan_is_located_by_site_in_execution_order() -> None:
    rec = records("r", steps=8)
    stats = clean(rec)
    nan = list(stats["stat"].values).index("nan")
    later = SITES.index("act:layers.0.mlp")
    stats[5:, later:, nan] = 3.0  # appears in act:layers.0.mlp at step 5 and spreads downstream
    stats[6:, :, nan] = 1.0
    found = find_anomalies(scalars(8), RunRecords("r", rec.fingerprints, stats, rec.model))
    first = found[found["rule"] == "nonfinite"].iloc[0]
    assert first["step"] == 5 and first["site"] == "act:layers.0.mlp"
    assert f"{len(SITES) - later} sites" in first["detail"]


def test_nonfinite_loss_without_site_records() -> None:
    run = scalars()
    run.loc[12, "loss"] = np.inf
    row = find_anomalies(run).iloc[0]
    assert (row["step"], row["rule"], row["site"]) == (12, "nonfinite", "scalar:loss")


def test_update_ratio_out_of_range() -> None:
    sites = ["param:layers.0.w", "param:layers.0.b", "update:layers.0.w", "update:layers.0.b"]
    rec = records("r", steps=10, sites=sites)
    stats = clean(rec)
    l2 = list(stats["stat"].values).index("l2")
    stats[:, 0, l2], stats[:, 2, l2] = 1.0, 0.01
    stats[:, 1, l2], stats[:, 3, l2] = 0.0, 0.01  # a zero parameter has no ratio
    stats[7, 2, l2] = 2.0
    stats[1, 2, l2] = 5.0  # before settle_steps: not judged
    found = find_anomalies(scalars(10), RunRecords("r", rec.fingerprints, stats, rec.model))
    assert list(zip(found["step"], found["site"])) == [(7, "update:layers.0.w")]
    assert found.iloc[0]["value"] == pytest.approx(2.0)


def test_bad_rules() -> None:
    with pytest.raises(ConfigError, match="window"):
        AnomalyRules(window=1)
    with pytest.raises(ConfigError, match="spike_factor"):
        AnomalyRules(spike_factor=0)

from __future__ import annotations

import numpy as np
import pytest

from workbench.analysis.cost import ThroughputSample, determinism_cost


def test_known_tax_and_interval() -> None:
    rng = np.random.default_rng(1)
    det = [ThroughputSample("A", True, rng.normal(900, 5, 50)) for _ in range(2)]
    fast = [ThroughputSample("A", False, rng.normal(1000, 5, 50)) for _ in range(2)]
    only_det = [ThroughputSample("B", True, rng.normal(500, 5, 50))]
    table = determinism_cost(det + fast + only_det)
    assert list(table["config"]) == ["A"]  # B has no default-mode runs to compare with
    row = table.iloc[0]
    assert row["tax_percent"] == pytest.approx(100 / 9, abs=0.5)  # 1000 / 900 - 1
    assert row["ci_low"] < row["tax_percent"] < row["ci_high"]
    assert row["ci_high"] - row["ci_low"] < 1.0
    assert row["steps_deterministic"] == 96  # 2 warm-up steps dropped per run


def test_no_difference_gives_an_interval_around_zero() -> None:
    rng = np.random.default_rng(2)
    samples = [ThroughputSample("A", flag, rng.normal(1000, 20, 40)) for flag in (True, False, True, False)]
    row = determinism_cost(samples).iloc[0]
    assert row["ci_low"] < 0 < row["ci_high"]

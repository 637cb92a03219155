"""Statistics read ahead in the background: later reads come from memory, within a memory budget."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from workbench.statistics import STAT_NAMES
from workbench.store.synthetic import write_synthetic_run
from workbench.workspace import PRELOAD_ENV, Workspace


def test_a_preloaded_run_answers_every_statistic_from_memory(tmp_path: Path) -> None:
    write_synthetic_run(tmp_path / "a", steps=40, sites=30, seed=1)
    write_synthetic_run(tmp_path / "b", steps=40, sites=30, seed=1, diverge_at=(10, 3))
    expected = {stat: Workspace.open(tmp_path / "a").stat_values("a", stat).to_numpy() for stat in STAT_NAMES}
    ws = Workspace.open(tmp_path)
    assert ws.preload(["a", "b", "a"]) == ["a", "b"] and ws.preload(["a"]) == []  # each run read once
    assert ws.preloaded(timeout=120)
    shutil.rmtree(tmp_path / "a" / "run.zarr" / "sites" / "stats")  # nothing left to read from the store
    for stat in STAT_NAMES:
        np.testing.assert_array_equal(ws.stat_values("a", stat).to_numpy(), expected[stat])
    assert ws.relative_difference("a", "b", "l2").sel(step=9).max() == 0  # equal before the divergence


def test_runs_beyond_the_budget_stay_lazy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_synthetic_run(tmp_path / "a", steps=40, sites=30)
    monkeypatch.setenv(PRELOAD_ENV, "0.01")  # 10 KiB: less than one run's statistics (40 x 30 x 12 x 8 bytes)
    ws = Workspace.open(tmp_path)
    assert ws.preload(["a"]) == [] and ws.preloaded(timeout=0)
    assert ws.stat_values("a", "max").shape == (40, 30)  # read on demand, as before

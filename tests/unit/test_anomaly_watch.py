"""Watching a run store while it is written: each new anomaly reported once, the watch ends with the run."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

import workbench.investigate.watch as anomaly_watch
from workbench.errors import ArgumentError
from workbench.investigate.watch import watch_anomalies
from workbench.statistics import STAT_NAMES
from workbench.store import layout, synthetic
from workbench.store.reader import open_run
from workbench.store.synthetic import write_synthetic_run
from workbench.store.writer import ScalarWriter, set_status, write_site_rows

SCALARS = {"grad_norm": 1.0, "lr": 1e-3, "loss_scale": 1.0, "step_time": 0.01, "tokens_per_s": 1e5,
       "recorder_time": 0.0, "skipped": 0}


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _keys(rows: list[pd.Series]) -> list[tuple[int, str, str]]:
    return [(int(r["step"]), str(r["rule"]), str(r["site"])) for r in rows]


def test_a_nan_written_while_watching_is_reported_once_and_the_watch_ends_with_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = write_synthetic_run(tmp_path / "live", steps=40, written=20, status=layout.Status.RUNNING)
    polls = []
    poll = anomaly_watch.poll_anomalies
    monkeypatch.setattr(anomaly_watch, "poll_anomalies", lambda *args: polls.append(1) or poll(*args))
    seen: list[pd.Series] = []
    with ThreadPoolExecutor(1) as pool:
        watch = pool.submit(watch_anomalies, run_dir, interval_s=0.01, on_new=seen.append, timeout_s=8)
        _wait_for(lambda: len(polls) >= 2, "the watch to read the clean steps")
        assert seen == [] and not watch.done()
        writer = ScalarWriter(run_dir, flush_every=1)
        writer.append(20, {**SCALARS, "loss": float("nan")})
        writer.append(21, {**SCALARS, "loss": 2.9})
        writer.close()  # flushed: the watch can see steps 20 and 21
        _wait_for(lambda: len(seen) >= 1, "the NaN to be reported")
        after = len(polls)
        _wait_for(lambda: len(polls) >= after + 3, "more polls over the same steps")
        assert not watch.done()  # still 'running'
        set_status(run_dir, layout.Status.COMPLETE)
        found = watch.result(timeout=5)
    assert _keys(seen) == [(20, "nonfinite", "scalar:loss")]  # once, although polled again and again
    assert _keys([row for _, row in found.iterrows()]) == [(20, "nonfinite", "scalar:loss")]


def test_a_watch_on_a_run_that_never_ends_stops_at_its_timeout(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "stuck", steps=12, written=6, status=layout.Status.RUNNING)
    start = time.monotonic()
    found = watch_anomalies(run_dir, interval_s=0.05, timeout_s=0.2)
    assert 0.2 <= time.monotonic() - start < 2.0
    assert found.empty


def test_a_finished_run_is_read_once_with_its_site_records(tmp_path: Path) -> None:
    run_dir = synthetic.write_synthetic_run(tmp_path / "done", steps=12, sites=6)
    run = open_run(run_dir)
    stats = run.sites()["stats"].to_numpy()[5:6].copy()  # [1, site, stat]
    stats[0, 2:, STAT_NAMES.index("nan")] = 4.0  # NaN appears in the third site at step 5
    write_site_rows(run_dir, 5, stats, run.fingerprints().to_numpy()[5:6])
    seen: list[pd.Series] = []
    start = time.monotonic()
    found = watch_anomalies(run_dir, interval_s=30.0, on_new=seen.append)
    assert time.monotonic() - start < 5.0  # complete: no second poll
    third_site = str(run.site_table().index[2])
    assert _keys(seen) == [(5, "nonfinite", third_site)]
    assert len(found) == 1


def test_bad_watch_settings() -> None:
    with pytest.raises(ArgumentError, match="interval_s"):
        watch_anomalies("nowhere", interval_s=0)
    with pytest.raises(ArgumentError, match="timeout_s"):
        watch_anomalies("nowhere", timeout_s=-1)

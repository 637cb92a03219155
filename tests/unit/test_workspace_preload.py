"""Statistics read ahead in the background: later reads come from memory, within a memory budget."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from workbench.statistics import STAT_NAMES
from workbench.store.synthetic import write_synthetic_run
from workbench.studies.workspace import PRELOAD_ENV, Workspace


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


def test_views_read_ahead_after_the_statistics_within_the_budget(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    write_synthetic_run(tmp_path / "a", steps=40, sites=30, seed=1)
    write_synthetic_run(tmp_path / "b", steps=40, sites=30, seed=1, diverge_at=(10, 3))
    ws = Workspace.open(tmp_path)
    ws.preload(["a", "b"])
    ran: list[str] = []

    def view(stat: str) -> int:
        ran.append(stat)
        assert ("a", stat) in ws.holding.keys("statistics"), "a view computed before the statistics were read"
        if stat == "min":
            raise ValueError("a view that fails is skipped")
        ws.relative_difference("a", "b", stat)
        return 0

    ws.read_ahead([lambda pause, stat=stat: view(stat) for stat in ("max", "min", "l2")])
    assert ws.preloaded(timeout=120)  # waits for the read-ahead too
    assert ran == ["max", "min", "l2"] and ws.derived_bytes() == 2 * 40 * 30 * 8

    one_view = 40 * 30 * 8 / 2**20
    monkeypatch.setenv(PRELOAD_ENV, str(1.5 * one_view))  # room for the first view only
    ws, ran = Workspace.open(tmp_path), []
    ws.read_ahead([lambda pause, stat=stat: (ran.append(stat), ws.relative_difference("a", "b", stat).nbytes * 0)[1]
                   for stat in ("max", "l2", "sum")])
    assert ws.preloaded(timeout=120)
    assert ran == ["max", "l2"]  # the second ran while there was room; the third found none


def _poll(condition, seconds: float = 60.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_background_waits_while_a_view_is_drawn_and_runs_when_the_view_waits_for_it(tmp_path: Path) -> None:
    write_synthetic_run(tmp_path / "a", steps=40, sites=30, seed=1)
    ws = Workspace.open(tmp_path)
    ran: list[str] = []
    with ws.foreground():
        ws.read_ahead([lambda pause: (ran.append("first"), 0)[1]])
        time.sleep(0.3)
        assert ran == []  # not begun while the view is drawn
        with ws.ahead.behind_background():  # the view waits for the background's work: it runs
            assert _poll(lambda: ran == ["first"])
        ws.read_ahead([lambda pause: (ran.append("second"), 0)[1]])
        time.sleep(0.3)
        assert ran == ["first"]
    assert _poll(lambda: ran == ["first", "second"])  # the view is drawn: the background goes on
    assert ws.preloaded(timeout=60)


def test_waiting_behind_the_background_outside_a_view_does_not_stop_it(tmp_path: Path) -> None:
    # a caller outside any view (a script asking for the step bins the background computes) waits for the
    # background: stepping back from a view it is not drawing would leave the background paused for good
    write_synthetic_run(tmp_path / "a", steps=40, sites=30, seed=1)
    ws = Workspace.open(tmp_path)
    ran: list[str] = []
    with ws.ahead.behind_background():
        ws.read_ahead([lambda pause: (pause(), ran.append("task"), 0)[2]])
        assert _poll(lambda: ran == ["task"])
    with ws.foreground():  # and a view still holds the background back afterwards
        ws.read_ahead([lambda pause: (ran.append("later"), 0)[1]])
        time.sleep(0.3)
        assert ran == ["task"]
    assert _poll(lambda: ran == ["task", "later"]) and ws.preloaded(timeout=60)


def test_a_background_read_waits_file_by_file_for_the_view(tmp_path: Path) -> None:
    write_synthetic_run(tmp_path / "a", steps=200, sites=30, seed=1)  # several files of rows
    ws = Workspace.open(tmp_path)
    expected = Workspace.open(tmp_path).stat_values("a", "max").to_numpy()
    waits: list[str] = []
    real_pause = ws.ahead.pause

    def pause() -> None:
        waits.append(threading.current_thread().name)
        real_pause()

    ws.ahead.pause = pause  # type: ignore[method-assign]
    got: list[np.ndarray] = []
    ws.read_ahead([lambda pause: (got.append(ws.peek_stat_values("a", "max", pause=pause).to_numpy()), 0)[1]])
    assert ws.preloaded(timeout=60)
    assert len(got) == 1
    assert len(waits) >= 1 + 200 // 64 and set(waits) == {"read-ahead"}  # before the task, then before each file
    np.testing.assert_array_equal(got[0], expected)


def test_a_ladder_of_stores_that_read_statistics_apart_holds_no_statistic_nor_fingerprints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pandas as pd

    from workbench.analysis.compare import compare
    from workbench.analysis.ladder import ladder
    from workbench.store.reader import Run, open_run

    for name, at in (("a", None), ("b", (70, 5)), ("c", (90, 2))):
        write_synthetic_run(tmp_path / name, steps=150, sites=600, seed=4, diverge_at=at)
    ws = Workspace.open(tmp_path)
    assert all(run.reads_statistics_apart for run in ws.runs.values())
    got = ws.ladder(["b", "c"], reference="a", stat="max")
    expected = ladder(open_run(tmp_path / "a").records(), [open_run(tmp_path / n).records() for n in "bc"],
                      stat="max")
    pd.testing.assert_frame_equal(got.per_layer, expected.per_layer)
    pd.testing.assert_frame_equal(got.summary, expected.summary)
    assert ws.holding.keys("records") == set() and ws.holding.keys("statistics") == set()  # read and dropped
    assert ws.derived_bytes() == 0  # nor the relative differences made from them

    reads: list[str] = []
    records, rows = Run.records, Run.fingerprint_rows
    monkeypatch.setattr(Run, "records", lambda self, **kw: (reads.append(self.name), records(self, **kw))[1])
    read_rows: list[int] = []
    monkeypatch.setattr(Run, "fingerprint_rows",
                        lambda self, start, stop: (read_rows.append(stop - start), rows(self, start, stop))[1])
    ws = Workspace.open(tmp_path)
    matrix = ws.pair_matrix()
    assert reads == [] and ws.holding.keys("records") == set()  # from the folds: no run's fingerprints read whole
    assert read_rows and max(read_rows) <= 64  # a block of rows at most, of the 150
    assert matrix.first_step.loc["a", "b"] == 70 and matrix.first_step.loc["a", "c"] == 90
    assert matrix.first_step.loc["b", "c"] == 70
    assert ws.comparison("a", "b").equal.equals(compare(records(open_run(tmp_path / "a")),
                                                        records(open_run(tmp_path / "b"))).equal)
    fresh = Workspace.open(tmp_path)
    assert fresh.comparison("a", "c", cells=True).equal.equals(ws.comparison("a", "c").equal)
    assert sorted(reads) == ["a", "c"]  # a heatmap's comparison: both runs' fingerprints read whole at once

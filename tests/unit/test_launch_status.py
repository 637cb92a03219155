"""The launcher's last word on a run: its status, or, when even that cannot be written, the store's state."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from workbench.runner import launch
from workbench.store import layout
from workbench.store.reader import open_run
from workbench.store.synthetic import write_synthetic_run


def test_a_status_that_cannot_be_written_is_one_sentence_on_the_stores_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = write_synthetic_run(tmp_path / "run", steps=4, sites=3, seed=1)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(launch, "set_status", full)
    said = launch._record_status(layout.RunPaths(run_dir), layout.Status.FAILED, error={"rank": 0})
    assert "could not be written" in said and "No space left on device" in said and "interrupted" in said
    assert "\n" not in said
    assert open_run(run_dir).status == "complete"  # nothing was written


def test_a_status_that_can_be_written_is_written_silently(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "run", steps=4, sites=3, seed=1)
    assert launch._record_status(layout.RunPaths(run_dir), layout.Status.FAILED, error={"rank": 0}) == ""
    assert open_run(run_dir).status == "failed"


def test_stopping_a_rank_that_ended_since_its_poll_is_no_error(tmp_path: Path) -> None:
    # a busy machine's run: the rank that lost its peer exited between the launcher's poll and its signal, and the
    # launch ended in ProcessLookupError instead of the failing rank's error
    import subprocess
    import sys

    from workbench.runner.launch import _Rank, _stop

    ended = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    ended.wait()

    class PolledBeforeItEnded:
        pid = ended.pid

        def poll(self) -> None:
            return None

        def wait(self, timeout: float | None = None) -> int:
            return 0

    _stop([_Rank(1, PolledBeforeItEnded(), tmp_path / "rank1.log")])  # type: ignore[arg-type]

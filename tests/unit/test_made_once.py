"""What the test session's workers train once and share (``tests/helpers/training.py``): the first worker to ask
makes it, the others wait for it and reuse it, and a failed make leaves nothing to reuse."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from tests.helpers.training import held, made_once


def _make(folder: Path) -> None:
    import time

    folder.mkdir()
    with open(folder.parent / "makes.log", "a") as log:
        log.write(f"{folder.name}\n")
    time.sleep(0.5)  # long enough that the other process asks while this one is still making it
    (folder / "made").write_text("done")


def _ask(folder: str) -> None:
    assert (made_once(Path(folder), _make) / "made").read_text() == "done"


def test_two_processes_asking_at_once_make_it_once_and_both_see_it_made(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    askers = [context.Process(target=_ask, args=(str(tmp_path / "runs"),)) for _ in range(2)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join(timeout=120)
    assert [asker.exitcode for asker in askers] == [0, 0]
    assert (tmp_path / "makes.log").read_text() == "runs\n"


def test_a_failed_make_leaves_nothing_and_the_next_ask_makes_it_again(tmp_path: Path) -> None:
    def failing(folder: Path) -> None:
        folder.mkdir()
        (folder / "half").write_text("")
        raise RuntimeError("rank 1 failed")

    with pytest.raises(RuntimeError, match="rank 1 failed"):
        made_once(tmp_path / "runs", failing)
    assert not (tmp_path / "runs").exists()
    assert (made_once(tmp_path / "runs", _make) / "made").read_text() == "done"
    assert made_once(tmp_path / "runs", failing) == tmp_path / "runs"  # made: not made again


def test_a_lock_held_past_its_deadline_says_which_lock(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    with held(tmp_path / "runs.lock"):
        waiter = context.Process(target=_wait_briefly, args=(str(tmp_path / "runs.lock"),))
        waiter.start()
        waiter.join(timeout=120)
    assert waiter.exitcode == 0


def _wait_briefly(lock: str) -> None:
    with pytest.raises(TimeoutError, match="runs.lock still held"):
        with held(Path(lock), deadline_s=0.5):
            pass


def test_the_folders_parent_is_made_for_its_lock(tmp_path: Path) -> None:
    assert (made_once(tmp_path / "shared" / "runs" / "base", _make) / "made").read_text() == "done"

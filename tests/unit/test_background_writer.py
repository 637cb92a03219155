from __future__ import annotations

import threading

import pytest

from workbench.store.writer import BackgroundWriter


def test_jobs_run_in_order_off_the_calling_thread() -> None:
    seen: list[tuple[int, str]] = []
    writer = BackgroundWriter(max_pending=2)
    for i in range(10):
        writer.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    writer.close()
    assert [i for i, _ in seen] == list(range(10))
    assert {name for _, name in seen} == {"store-writer"}


def test_a_failed_write_is_reported_not_lost() -> None:
    writer = BackgroundWriter()

    def fail() -> None:
        raise OSError("disk full")

    writer.submit(fail)
    with pytest.raises(OSError, match="writing the run store failed: disk full"):  # an OSError still: a full
        writer.close()                                                               # disk is said in one line

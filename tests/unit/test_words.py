"""Counts in sentences agree with their numbers."""

from __future__ import annotations

from workbench.words import counted


def test_one_is_singular_and_every_other_count_plural() -> None:
    assert counted(1, "run") == "1 run"
    assert counted(0, "run") == "0 runs" and counted(13, "group") == "13 groups"
    assert counted(2, "process", "processes") == "2 processes" and counted(1, "process", "processes") == "1 process"

"""Where the suite's time goes: each test's seconds (set-up, call and tear-down) summed by folder, printed at the
end of every pytest session and appended to ``$WORKBENCH_TEST_TIMES`` (one JSON line a session), which
``tests/budget.py`` reads at the end of ``make test`` to print every phase and folder beside its budget."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field


def folder_of(nodeid: str) -> str:
    """``tests/unit/test_x.py::test_y`` -> ``unit``; a test outside ``tests/`` is counted under ``other``."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


@dataclass
class FolderTimes:
    """Seconds and test counts by folder for one pytest session, and the session's own wall time."""

    started: float = field(default_factory=time.monotonic)
    seconds: dict[str, float] = field(default_factory=dict)
    tests: dict[str, int] = field(default_factory=dict)

    def add(self, nodeid: str, when: str, duration: float) -> None:
        folder = folder_of(nodeid)
        self.seconds[folder] = self.seconds.get(folder, 0.0) + duration
        if when == "call":
            self.tests[folder] = self.tests.get(folder, 0) + 1

    def lines(self, workers: int) -> list[str]:
        wall = time.monotonic() - self.started
        how = f"{workers} workers, so the summed seconds exceed the wall time" if workers > 1 else "one process"
        out = [f"per-folder times ({how}): session wall {wall:.0f} s"]
        for folder in sorted(self.seconds, key=self.seconds.__getitem__, reverse=True):
            out.append(f"  {folder:<12} {self.tests.get(folder, 0):>5} tests  {self.seconds[folder]:>7.1f} s")
        return out

    def save(self, path: str, workers: int, phase: str) -> None:
        record = {"phase": phase, "wall": round(time.monotonic() - self.started, 1), "workers": workers,
                  "seconds": {k: round(v, 1) for k, v in self.seconds.items()}, "tests": self.tests}
        with open(path, "a") as out:
            out.write(json.dumps(record) + "\n")

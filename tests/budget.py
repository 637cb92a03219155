"""Print each phase of ``make test`` and each folder's seconds beside its budget; ``make test`` runs it last.

    python tests/budget.py build/test-times.jsonl

Reads the JSON lines that ``tests/helpers/timing.py`` appends, one per pytest session. The budgets are wall
seconds on the CI machine (2 cores, no GPU) with another CPU-bound job beside it for the whole run; the whole
``.ci/run`` (set-up and lint included) has 30 minutes busy and 20 idle (docs/performance.md). A phase over its
budget is printed as such, and the run still passes: speed is measured here, never asserted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PHASES: dict[str, float] = {
    "current: unit and property": 420,
    "current: multi-process": 770,
    "floor: unit and property": 95,
    "floor: multi-process": 105,
    "megatron-core 0.17.1": 85,
    "megatron-core 0.18.2": 85,
}
"""Wall seconds per pytest session, busy (1,560 s in all: set-up and lint took 218 s of the 30 minutes in the busy
pair at 7a8091d). Measured there, clones A and B side by side (docs/performance.md): 396 and 394, 755 and 755,
88 and 90, 94 and 94, 76 and 76, 79 and 79."""

FOLDERS: dict[tuple[str, str], float] = {
    ("current: unit and property", "unit"): 720,
    ("current: unit and property", "property"): 60,
    ("current: multi-process", "integration"): 1000,
    ("current: multi-process", "notebooks"): 300,
    ("current: multi-process", "browser"): 370,
}
"""Test seconds summed over a session's workers, busy: a folder's share of its phase, so that a change that
breaks the budget shows where."""


def report(lines: list[dict[str, object]]) -> list[str]:
    out = [f"{'phase / folder':<48} {'tests':>6} {'seconds':>8} {'budget':>7}"]
    total = over = 0.0
    for record in lines:
        phase, wall = str(record["phase"]), float(record["wall"])  # type: ignore[arg-type]
        budget = PHASES.get(phase)
        flag = "  OVER BUDGET" if budget is not None and wall > budget else ""
        over += bool(flag)
        total += wall
        tests = sum(record["tests"].values())  # type: ignore[union-attr]
        out.append(f"{phase:<48} {tests:>6} {wall:>8.0f} {budget or '':>7}{flag}  (wall, {record['workers']} "
                   f"{'workers' if record['workers'] != 1 else 'process'})")
        for folder, seconds in sorted(record["seconds"].items(), key=lambda kv: -kv[1]):  # type: ignore[union-attr]
            budget = FOLDERS.get((phase, folder))
            flag = "  OVER BUDGET" if budget is not None and seconds > budget else ""
            out.append(f"  {folder:<46} {record['tests'].get(folder, 0):>6} {seconds:>8.0f} "  # type: ignore[union-attr]
                       f"{budget or '':>7}{flag}")
    out.append(f"{'all phases':<48} {'':>6} {total:>8.0f} {sum(PHASES.values()):>7.0f}"
               f"{'  OVER BUDGET' if total > sum(PHASES.values()) else ''}")
    return out


def main(path: str) -> int:
    file = Path(path)
    if not file.is_file():
        print(f"budget: {path} does not exist: no pytest session wrote its times (WORKBENCH_TEST_TIMES)")
        return 0
    print("\n".join(report([json.loads(line) for line in file.read_text().splitlines() if line.strip()])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/test-times.jsonl"))

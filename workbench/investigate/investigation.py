"""From an anomaly to its operation: find it, replay it, bisect it against a healthy run.

    found = investigate("data/runs/demo/fault", reference="data/runs/demo/det-r0")
    print(found.summary())

1. ``analysis.anomalies`` over the run: the first anomaly's step K.
2. ``replay``: the run again from its nearest checkpoint before K through K, every site
   recorded and snapshotted at K. A deterministic run is expected to reproduce the anomaly
   bitwise, which turns a one-off "ghost" into something that can be rerun at will; the
   summary says whether it did, and where it departed if not.
3. ``bisect`` against the reference (a healthy run of the same model): step, site and the
   first operation whose outputs differ, with its module path and source line.

Results land next to the run: ``RUN/replays/step_K`` and ``RUN/bisect/``. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.analysis.anomalies import AnomalyRules, find_anomalies
from workbench.investigate.bisect import Bisect, bisect
from workbench.investigate.replay import Replay, replay
from workbench.runner.launch import ProgressFn
from workbench.store.reader import open_run


@dataclass(frozen=True)
class Investigation:
    run: str
    anomalies: pd.DataFrame
    step: int | None
    """The first anomaly's step (None: no anomaly, nothing replayed)."""
    replay: Replay | None
    bisect: Bisect | None

    def summary(self) -> str:
        if self.step is None:
            return f"{self.run}: no anomalies, nothing to replay"
        first = self.anomalies.iloc[0]
        count = f"{len(self.anomalies)} anomal{'y' if len(self.anomalies) == 1 else 'ies'}"
        lines = [f"{self.run}: {count}; the first: step {self.step}, {first['rule']} "
                 f"({first['detail']})"]
        if self.replay is not None:
            lines.append(self.replay.summary())
        if self.bisect is not None:
            lines.append(self.bisect.summary())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "step": self.step,
                "anomalies": self.anomalies.astype(object).where(self.anomalies.notna(), None).to_dict("records"),
                "replay": self.replay.to_dict() if self.replay else None,
                "bisect": self.bisect.to_dict() if self.bisect else None}


def investigate(run_path: str | Path, *, reference: str | Path | None = None, rules: AnomalyRules | None = None,
                overwrite: bool = False, progress: ProgressFn | None = None) -> Investigation:
    """Anomalies of a run; replay of the first one; bisect against ``reference`` if given."""
    run = open_run(run_path)
    found = find_anomalies(run.scalars, run.records_or_none(), rules or AnomalyRules(),
                           scalars_logged=run.logs_scalars)
    if found.empty:
        return Investigation(run=run.name, anomalies=found, step=None, replay=None, bisect=None)
    step = int(found["step"].iloc[0])
    if progress:
        progress(f"first anomaly of {run.name} at step {step}: replaying it")
    replayed = replay(run.path, step, overwrite=overwrite, progress=progress)
    bisected = None
    if reference is not None:
        if progress:
            progress(f"bisecting {run.name} against {Path(reference).name}")
        bisected = bisect(reference, run.path, out=run.path / "bisect", overwrite=overwrite, progress=progress)
    return Investigation(run=run.name, anomalies=found, step=step, replay=replayed, bisect=bisected)

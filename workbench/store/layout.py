"""The run store's layout: the one module that spells paths, names, dtypes and chunks.

A run lives in a folder:

    <run_dir>/
      run.zarr/                 Zarr v3 group; attributes = the manifest
        scalars/                group, dimension ``step``
          step                  int64 [step]    coordinate 0..steps-1
          loss, grad_norm, lr, loss_scale, step_time, tokens_per_s   float64 [step]
          skipped               int8 [step]     1 where fp16 overflow skipped the update
          done                  int8 [step]     1 once the step's row is written (written last)
      logs/rank<R>.log          one log per rank
      checkpoints/step_<K>/     state before step K (after K updates)

Arrays are preallocated to the planned number of steps (NaN / 0), so a reader sees the
same shapes while the run writes and after it was killed; ``done`` says which rows are
real. Zarr's local store writes each chunk to a temporary file and renames it, so a
chunk is either the old one or the new one, never half-written. Only global rank 0
writes ``scalars``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SCHEMA_VERSION = 1
STORE_KIND = "workbench.run"

STORE_DIR = "run.zarr"
LOGS_DIR = "logs"
CHECKPOINTS_DIR = "checkpoints"

SCALARS_GROUP = "scalars"
STEP_DIM = "step"
STEP_CHUNK = 512

SCALAR_FIELDS: dict[str, str] = {
    "loss": "float64",
    "grad_norm": "float64",
    "lr": "float64",
    "loss_scale": "float64",
    "step_time": "float64",
    "tokens_per_s": "float64",
    "skipped": "int8",
}
"""Per-step scalars and their dtypes; seconds for ``step_time``."""
DONE_FIELD = "done"


class Status:
    CREATED = "created"
    RUNNING = "running"
    COMPLETE = "complete"
    STOPPED = "stopped"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    """Never written: a reader's verdict on a 'running' store whose launcher is gone."""


@dataclass(frozen=True)
class RunPaths:
    """Where each part of one run lives."""

    run_dir: Path

    @property
    def store(self) -> Path:
        return self.run_dir / STORE_DIR

    @property
    def logs(self) -> Path:
        return self.run_dir / LOGS_DIR

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / CHECKPOINTS_DIR

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:06d}"

    def checkpoint_steps(self) -> list[int]:
        """Steps with a complete checkpoint (its ``meta.json`` is written last)."""
        if not self.checkpoints.is_dir():
            return []
        steps = [int(p.name.removeprefix("step_")) for p in self.checkpoints.glob("step_*")
                 if (p / "meta.json").is_file()]
        return sorted(steps)


def resolve_run_dir(path: Path) -> Path | None:
    """The run folder for a path naming either the folder or its ``run.zarr``; None if neither."""
    if (path / STORE_DIR / "zarr.json").is_file():
        return path
    if path.name == STORE_DIR and (path / "zarr.json").is_file():
        return path.parent
    return None

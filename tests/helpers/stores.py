"""Run stores written through the real writer, with made-up scalars and no training."""

from __future__ import annotations

from pathlib import Path

from workbench.config import RunConfig
from workbench.store.manifest import runner_manifest
from workbench.store.writer import ScalarWriter, create_store, set_status

SCALARS = {"grad_norm": 1.0, "lr": 1e-3, "loss_scale": 1.0, "step_time": 0.1, "tokens_per_s": 1e4,
           "recorder_time": 0.0, "skipped": 0}
"""One step's scalars but the loss."""


def write_synthetic_run(run_dir: Path, *, steps: int = 12, written: int | None = None, name: str = "synthetic",
                        status: str | None = "complete", loss_offset: float = 0.0) -> Path:
    """A run store with ``written`` of ``steps`` rows of made-up scalars, no training involved."""
    cfg = RunConfig(name=name, steps=steps)
    create_store(run_dir, runner_manifest(cfg), steps)
    writer = ScalarWriter(run_dir, flush_every=4)
    for step in range(steps if written is None else written):
        writer.append(step, {"loss": 5.0 - 0.1 * step + loss_offset, "grad_norm": 1.0, "lr": 1e-3,
                             "loss_scale": 1.0, "step_time": 0.01, "tokens_per_s": 1e5, "recorder_time": 0.0,
                             "skipped": 0})
    writer.close()
    if status is not None:
        set_status(run_dir, status)
    return run_dir

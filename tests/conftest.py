"""Shared fixtures: small synthetic run stores written through the real writer."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from workbench.config import RunConfig
from workbench.manifest import new_manifest
from workbench.store.writer import ScalarWriter, create_store, set_status


def write_synthetic_run(run_dir: Path, *, steps: int = 12, written: int | None = None, name: str = "synthetic",
                        status: str | None = "complete", loss_offset: float = 0.0) -> Path:
    """A run store with ``written`` of ``steps`` rows of made-up scalars, no training involved."""
    cfg = RunConfig(name=name, steps=steps)
    create_store(run_dir, new_manifest(cfg), steps)
    writer = ScalarWriter(run_dir, flush_every=4)
    for step in range(steps if written is None else written):
        writer.append(step, {"loss": 5.0 - 0.1 * step + loss_offset, "grad_norm": 1.0, "lr": 1e-3,
                             "loss_scale": 1.0, "step_time": 0.01, "tokens_per_s": 1e5, "recorder_time": 0.0,
                             "skipped": 0})
    writer.close()
    if status is not None:
        set_status(run_dir, status)
    return run_dir


@pytest.fixture
def synthetic_run(tmp_path: Path) -> Path:
    return write_synthetic_run(tmp_path / "synthetic")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def mini_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo study in miniature (``tests/mini_demo.toml``), trained once per session for the
    notebook, report and browser tests. ``WORKBENCH_MINI_DEMO=DIR`` keeps them in DIR across
    sessions (complete runs are not trained again)."""
    from workbench.study import load_study, run_study

    kept = os.environ.get("WORKBENCH_MINI_DEMO")
    out = Path(kept) if kept else tmp_path_factory.mktemp("mini-demo")
    run_study(load_study(Path(__file__).parent / "mini_demo.toml"), out, lambda *args: None)
    return out

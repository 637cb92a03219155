"""Shared fixtures: small synthetic run stores written through the real writer."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.config import RunConfig
from workbench.store.manifest import runner_manifest
from workbench.store.writer import ScalarWriter, create_store, set_status

TESTS = Path(__file__).parent
TRAINS = re.compile(r"^\s*(import|from) (torch|megatron)\b|importorskip\([\"'](torch|megatron)|workbench\.runner|"
                    r"\blaunch\(|train_user_loop|\buser_runs\b", re.MULTILINE)
"""What makes a test module a ``training`` one: it imports torch or Megatron Core, or trains."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``training`` every test that imports torch or megatron or trains a run: ``make test`` runs the whole
    suite in one environment and ``-m training`` in the other. The notebook and browser tests are not marked:
    they train the mini demo only to have runs to show."""
    verdicts: dict[Path, bool] = {}
    for item in items:
        path = Path(str(item.path))
        if path not in verdicts:
            part = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else ""
            verdicts[path] = part == "integration" or (
                part in ("unit", "property") and TRAINS.search(path.read_text()) is not None)
        if verdicts[path]:
            item.add_marker(pytest.mark.training)


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
    from workbench.studies.study import load_study, run_study

    kept = os.environ.get("WORKBENCH_MINI_DEMO")
    out = Path(kept) if kept else tmp_path_factory.mktemp("mini-demo")
    run_study(load_study(Path(__file__).parent / "mini_demo.toml"), out, lambda *args: None)
    return out


USER_LOOP = Path(__file__).parent / "integration" / "user_loop.py"
"""A researcher's own Megatron Core loop, recorded with ``workbench.recorder.record``."""


def train_user_loop(run_dir: Path, *args: str, ranks: int = 2, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``user_loop.py`` on ``ranks`` processes (torchrun, gloo); with ``ok``, assert it succeeded."""
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                             str(ranks), str(USER_LOOP), str(run_dir), *args], capture_output=True, text=True,
                            timeout=900)
    if ok:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


@pytest.fixture(scope="session")
def user_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of four runs of the user loop: TP=2 twice (once without its validation loss), TP=2 with one
    flipped bit at step 2, PP=2."""
    root = tmp_path_factory.mktemp("user-runs")
    train_user_loop(root / "tp2", "--tp", "2")
    train_user_loop(root / "tp2-again", "--tp", "2", "--eval-every", "0")
    train_user_loop(root / "tp2-flip", "--tp", "2", "--flip", "2:decoder.layers.1.mlp")
    train_user_loop(root / "pp2", "--pp", "2")
    return root

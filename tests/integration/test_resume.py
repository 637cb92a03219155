"""A run stopped and resumed from a checkpoint follows the uninterrupted run bitwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.integration.conftest import Runs, tiny_config
from workbench.errors import CheckpointError
from workbench.runner.checkpoint import load_full_params
from workbench.runner.launch import launch
from workbench.store.reader import open_run


def test_resumed_run_is_bitwise_identical_to_the_uninterrupted_one(runs: Runs, tmp_path: Path) -> None:
    cfg = tiny_config("resumed", steps=6, checkpoint_every=2)
    uninterrupted = runs.get("six", steps=6, checkpoint_every=2)
    resumed = tmp_path / "resumed"
    launch(cfg, resumed, stop_after=3)
    stopped = open_run(resumed)
    assert stopped.status == "stopped" and stopped.steps_completed == 3
    launch(cfg, resumed, resume=True)
    run = open_run(resumed)
    assert run.status == "complete" and run.manifest["resumes"] == [2]
    reference = open_run(uninterrupted).scalars
    for column in ("loss", "grad_norm", "lr"):
        np.testing.assert_array_equal(run.scalars[column], reference[column], err_msg=column)
    final_a = load_full_params(uninterrupted / "checkpoints" / "step_000006")
    final_b = load_full_params(resumed / "checkpoints" / "step_000006")
    assert all(torch.equal(final_a[s], final_b[s]) for s in final_a)


def test_resume_needs_a_checkpoint(tmp_path: Path) -> None:
    cfg = tiny_config("nockpt", checkpoint_every=0)
    launch(cfg, tmp_path / "r", stop_after=1)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        launch(cfg, tmp_path / "r", resume=True)


def test_resume_refuses_a_different_config(runs: Runs) -> None:
    with pytest.raises(CheckpointError, match="different config"):
        launch(tiny_config("base", seed=99), runs.get("base"), resume=True)


def test_checkpoints_load_without_code(runs: Runs) -> None:
    directory = runs.get("base") / "checkpoints" / "step_000001"
    for file in directory.glob("*.pt"):
        torch.load(file, weights_only=True)  # raises if the file needed pickled code

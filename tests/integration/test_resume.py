"""A run stopped and resumed from a checkpoint follows the uninterrupted run bitwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.training import Runs, tiny_config
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
    assert run.status == "complete" and run.attrs["resumes"] == [2]
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
    files = sorted(directory.glob("*.pt"))
    assert files, f"no checkpoint files in {directory}: {sorted(p.name for p in directory.iterdir())}"
    for file in files:
        torch.load(file, weights_only=True)  # raises if the file needed pickled code


@pytest.mark.parametrize("name, overrides, source_format", [
    ("from-tp2-at-tp1", {}, "runner"), ("from-tp2-at-dp2", {"layout.dp": 2}, "runner"),
    ("from-megatron-tp2-at-tp1", {}, "megatron")])
def test_a_run_starts_at_another_layout_from_a_tp2_checkpoint(runs: Runs, tmp_path: Path, name: str,
                                                                 overrides: dict[str, int], source_format: str) -> None:
    from workbench.analysis.resume import resume_check

    source = runs.get("tp2", **{"layout.tp": 2}) if source_format == "runner" else \
        runs.get("tp2-megatron", **{"layout.tp": 2, "checkpoint_format": "megatron"})
    reference = runs.get("base") if not overrides else runs.get("dp2", **{"layout.dp": 2})
    started = launch(tiny_config(name, **overrides), tmp_path / name, start_from=source / "checkpoints" / "step_000002")
    run = open_run(started)
    assert run.status == "complete" and run.attrs["resumes"] == [2] and run.first_step == 2
    assert run.attrs["started_from"]["step"] == 2 and run.attrs["started_from"]["layout"]["tp"] == 2
    # a Megatron-format checkpoint's model is resharded by megatron.core.dist_checkpointing itself
    assert ("dist_checkpointing" in run.attrs["started_from"]["model_loaded_by"]) == (source_format == "megatron")
    if source_format == "megatron":  # saving through dist_checkpointing changes no number of the run
        from workbench.analysis.compare import compare

        assert compare(open_run(source).records(), open_run(runs.get("tp2", **{"layout.tp": 2})).records()).identical
    # the TP shards joined and split again: the new layout holds the checkpoint's state exactly
    before, after = (load_full_params(r / "checkpoints" / "step_000002") for r in (source, started))
    assert sorted(before) == sorted(after) and all(torch.equal(before[n], after[n]) for n in before)
    check = resume_check(run.records(), open_run(reference).records(), floor=open_run(source).records())
    # it departs from the uninterrupted run at the new layout at once (TP2 and TP1 parted at step 0) and stays
    # as close to it as the TP2 run does
    assert check.first_step == 2 and check.within_floor, check.summary()


def test_starting_at_another_layout_needs_the_same_training(runs: Runs, tmp_path: Path) -> None:
    source = runs.get("tp2", **{"layout.tp": 2})
    with pytest.raises(CheckpointError, match="beyond the layout"):
        launch(tiny_config("other-lr", **{"optim.lr": 0.02}), tmp_path / "x", start_from=source)
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        launch(tiny_config("nowhere"), tmp_path / "y", start_from=tmp_path)


ZERO1 = {"layout.dp": 2, "precision": "bf16", "optim.use_distributed_optimizer": True,
         "optim.overlap_grad_reduce": True, "optim.overlap_param_gather": True}
"""What large runs train with: bf16 over fp32 main parameters, Megatron's distributed optimizer, overlapped
gradient reduction and parameter gathering."""


def test_a_distributed_optimizer_run_resumes_and_replays_bitwise_and_starts_another_layout(
        runs: Runs, tmp_path: Path) -> None:
    from workbench.investigate.replay import replay
    from workbench.runner.checkpoint import load_full_state
    from workbench.sites import PARAMETER_KINDS

    uninterrupted = runs.get("zero1", steps=6, checkpoint_every=2, **ZERO1)
    cfg = tiny_config("zero1-resumed", steps=6, checkpoint_every=2, **ZERO1)
    resumed = tmp_path / "resumed"
    launch(cfg, resumed, stop_after=3)
    launch(cfg, resumed, resume=True)
    run, reference = open_run(resumed), open_run(uninterrupted)
    assert run.status == "complete" and run.attrs["resumes"] == [2]
    for column in ("loss", "grad_norm", "lr"):
        np.testing.assert_array_equal(run.scalars[column], reference.scalars[column], err_msg=column)
    # each data-parallel rank's shards of the main parameters and moments, joined by name, at every checkpoint
    for step in (4, 6):
        a, b = (load_full_state(r / "checkpoints" / f"step_00000{step}") for r in (uninterrupted, resumed))
        assert sorted(a["optimizer_named"]) == sorted(b["optimizer_named"])
        for name, state in a["optimizer_named"].items():
            assert sorted(state) == ["exp_avg", "exp_avg_sq", "master", "step"], name
            assert all(torch.equal(state[k], b["optimizer_named"][name][k]) for k in state), name
    # a replay from the sharded checkpoint reproduces the run; its snapshots leave the parameter-sized sites out
    replayed = replay(uninterrupted, 3, out=tmp_path / "replay")
    assert replayed.check.reproduced and replayed.check.steps == [2, 3], replayed.check.summary()
    snapshots = open_run(tmp_path / "replay").snapshots()[3]
    assert snapshots and not [s for s in snapshots if s.split(":")[0] in PARAMETER_KINDS]
    # one process, Megatron's plain optimizer, from the sharded checkpoint: it holds every shard exactly
    source = uninterrupted / "checkpoints" / "step_000002"
    started = launch(tiny_config("one-rank", steps=6, checkpoint_every=2, precision="bf16"), tmp_path / "one-rank",
                     start_from=source, stop_after=3)
    before, after = load_full_state(source), load_full_state(started / "checkpoints" / "step_000002")
    for name, state in before["optimizer_named"].items():
        assert all(torch.equal(state[k], after["optimizer_named"][name][k]) for k in state), name
    assert all(torch.equal(before["params"][n], after["params"][n]) for n in before["params"])

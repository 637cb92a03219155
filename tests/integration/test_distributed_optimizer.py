"""A researcher's own DP=2 loop with Megatron's distributed optimizer (ZeRO-1), gradient clipping, overlapped
gradient reduction and overlapped parameter gathering, recorded with ``record`` (tests/integration/user_loop.py,
``--optimizer megatron``): on the CPU through ``cpu_compat``, in every environment.

The loop saves the full tensors it sees (``--expect``): the parameters as its first forward used them, the fully
reduced gradients (each bucket's reduced shards gathered from both ranks by Megatron DDP's own split) and the
gathered parameters after the step minus those. Each rank records only the shards it owns, and the store's
fingerprints must equal those of the full tensors, at every step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.training import train_user_loop
from workbench.analysis.compare import compare
from workbench.statistics import fingerprint_reference
from workbench.store.reader import open_run

KINDS = "param,act,act_grad,grad_local,grad,loss,exp_avg,exp_avg_sq,update"
ZERO1 = ("--optimizer", "megatron", "--bucket-size", "2000", "--steps", "3", "--eval-every", "0", "--kinds", KINDS,
         "--ddp", "overlap_grad_reduce")
"""Megatron's Adam with clipping, buckets small enough that the shards split parameters mid-row."""
DISTRIBUTED = ("--ddp", "use_distributed_optimizer", "--ddp", "overlap_param_gather")


@pytest.fixture(scope="module")
def zero1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zero1")
    train_user_loop(root / "plain", *ZERO1, "--expect", str(root / "plain.pt"))
    train_user_loop(root / "distributed", *ZERO1, *DISTRIBUTED, "--expect", str(root / "distributed.pt"))
    return root


def test_every_kind_is_recorded_under_the_distributed_optimizer(zero1: Path) -> None:
    run = open_run(zero1 / "distributed")
    assert run.status == "complete" and run.steps_completed == 3 and run.manifest.layout.dp == 2
    assert set(run.site_table()["kind"]) == set(KINDS.split(",")) - {"grad_local"}
    missing = run.attrs["kinds_missing"]  # reduced bucket by bucket during the backward pass
    assert list(missing) == ["grad_local"] and missing["grad_local"].startswith("overlap_grad_reduce: ")
    assert len(run.fingerprints().columns) == len(open_run(zero1 / "plain").fingerprints().columns) > 150


@pytest.mark.parametrize("name", ["distributed", "plain"])
def test_param_grad_and_update_are_the_full_tensors_the_loop_saw_at_every_step(zero1: Path, name: str) -> None:
    fingerprints = open_run(zero1 / name).fingerprints()
    expected = torch.load(zero1 / f"{name}.pt")
    assert sorted(expected) == [0, 1, 2]
    checked = 0
    for step, kinds in expected.items():
        assert sorted(kinds) == ["grad", "param", "update"]
        for kind, tensors in kinds.items():
            assert len(tensors) == 29
            for site, tensor in tensors.items():
                assert int(fingerprints.loc[step, f"{kind}:{site}"]) == fingerprint_reference(tensor.numpy()), \
                    (step, kind, site)
                checked += 1
    assert checked == 3 * 3 * 29


def test_the_first_step_equals_megatrons_plain_optimizer(zero1: Path) -> None:
    sharded, plain = open_run(zero1 / "distributed").fingerprints(), open_run(zero1 / "plain").fingerprints()
    columns = [c for c in plain.columns if c.split(":")[0] in ("param", "grad", "act", "loss")]
    assert len(columns) > 70  # 29 parameters and their gradients, 13 activations, the loss
    assert sharded.loc[0, columns].equals(plain.loc[0, columns])
    # From the first update on they part: each rank's optimizer clips by a norm summed over its shards, then
    # over the ranks, in another order than the plain optimizer's.
    assert not sharded.loc[1:, "param:layers.0.mlp.linear_fc1.weight"].equals(
        plain.loc[1:, "param:layers.0.mlp.linear_fc1.weight"])


def test_two_runs_are_bitwise_identical_and_a_one_bit_change_is_found_at_its_step_and_site(
        zero1: Path, tmp_path: Path) -> None:
    train_user_loop(tmp_path / "again", *ZERO1, *DISTRIBUTED)
    train_user_loop(tmp_path / "flip", *ZERO1, *DISTRIBUTED, "--flip", "2:decoder.layers.1.mlp")
    first = open_run(zero1 / "distributed").records()
    assert compare(first, open_run(tmp_path / "again").records()).identical
    result = compare(first, open_run(tmp_path / "flip").records())
    assert (result.first_step, result.first_site) == (2, "act:layers.1.mlp")

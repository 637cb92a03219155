"""Deterministic runs repeat bitwise; nondeterministic runs (emulated atomics on CPU) do not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.training import LAYOUTS, Runs, tiny_config
from workbench.runner.checkpoint import load_full_params
from workbench.store.reader import open_run


def _params(run_dir, step):  # type: ignore[no-untyped-def]
    return load_full_params(run_dir / "checkpoints" / f"step_{step:06d}")


def test_deterministic_repeats_are_bitwise_identical_at_every_step(runs: Runs) -> None:
    a, b = runs.get("base"), runs.get("base-repeat")
    steps = open_run(a).config.steps
    for step in range(steps + 1):
        pa, pb = _params(a, step), _params(b, step)
        for site in pa:
            assert torch.equal(pa[site], pb[site]), f"step {step} {site} differs"
    np.testing.assert_array_equal(open_run(a).scalars.loss, open_run(b).scalars.loss)
    np.testing.assert_array_equal(open_run(a).scalars.grad_norm, open_run(b).scalars.grad_norm)
    # b evaluated its held-out loss after every step, a after the last only: no training number changed
    val_a, val_b = open_run(a).scalars.val_loss, open_run(b).scalars.val_loss
    assert val_b.notna().all() and val_a[:-1].isna().all() and val_a.iloc[-1] == val_b.iloc[-1]
    assert len(set(val_b)) == steps and not np.array_equal(val_b, open_run(b).scalars.loss)


def test_nondeterministic_repeats_differ(runs: Runs) -> None:
    a, b = runs.get("nondet-a", deterministic=False), runs.get("nondet-b", deterministic=False)
    final = open_run(a).config.steps
    pa, pb = _params(a, final), _params(b, final)
    differing = [site for site in pa if not torch.equal(pa[site], pb[site])]
    assert "embedding.word_embeddings.weight" in differing
    # Same init: the difference comes from training, not from the start.
    p0a, p0b = _params(a, 0), _params(b, 0)
    assert all(torch.equal(p0a[s], p0b[s]) for s in p0a)
    # ... and it stays a last-bits difference in a short run.
    np.testing.assert_allclose(open_run(a).scalars.loss, open_run(b).scalars.loss, rtol=1e-4)


def test_manifest_says_what_is_emulated(runs: Runs) -> None:
    det = open_run(runs.get("base")).attrs["determinism"]
    nondet = open_run(runs.get("nondet-a", deterministic=False)).attrs["determinism"]
    assert det["deterministic"] and det["emulated_nondeterminism"] == []
    assert det["env"]["NCCL_ALGO"] == "Ring" and det["env"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert det["transformer_config"]["deterministic_mode"] is True
    assert not nondet["deterministic"]
    assert any("word_embeddings" in line for line in nondet["emulated_nondeterminism"])
    assert nondet["env"]["NCCL_ALGO"] is None


def test_ranks_forked_by_the_zygote_train_bitwise_like_ranks_started_as_processes(
        runs: Runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's runs are trained by ranks the zygote forks (``workbench.runner.zygote``, on the CPU); a GPU
    launch, or ``WORKBENCH_FORK_RANKS=0``, starts each rank as its own process. Both give the same numbers."""
    from workbench.analysis.compare import compare
    from workbench.runner import zygote
    from workbench.runner.launch import launch

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a rank was forked with WORKBENCH_FORK_RANKS=0")

    forked = runs.get("dp2", **LAYOUTS["dp2"])
    monkeypatch.setenv(zygote.ENABLE_ENV, "0")
    monkeypatch.setattr(zygote.Zygote, "start", refuse)
    launch(tiny_config("dp2", **LAYOUTS["dp2"]), tmp_path / "dp2")
    started = open_run(tmp_path / "dp2")
    assert compare(open_run(forked).records(), started.records()).identical
    np.testing.assert_array_equal(open_run(forked).scalars.loss, started.scalars.loss)

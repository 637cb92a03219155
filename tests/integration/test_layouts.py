"""TP=2, PP=2, DP=2 and TP=2 x PP=2 runs against the TP=1 PP=1 DP=1 run of the same seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.training import LAYOUTS, Runs
from workbench.runner.checkpoint import load_full_params
from workbench.store.reader import open_run


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_initialisation_does_not_depend_on_the_layout(runs: Runs, name: str) -> None:
    reference = load_full_params(runs.get("base") / "checkpoints" / "step_000000")
    other = load_full_params(runs.get(name, **LAYOUTS[name]) / "checkpoints" / "step_000000")
    assert sorted(other) == sorted(reference)
    for site, tensor in reference.items():
        assert other[site].shape == tensor.shape, site
        assert torch.equal(other[site], tensor), f"{site}: max abs diff {(other[site] - tensor).abs().max()}"


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layouts_train_the_same_model(runs: Runs, name: str) -> None:
    reference = open_run(runs.get("base")).scalars
    run = open_run(runs.get(name, **LAYOUTS[name]))
    assert run.status == "complete"
    assert run.attrs["layout"]["world_size"] == int(np.prod([v for v in LAYOUTS[name].values()]))
    # Same model, same batches: equal up to float reassociation, not necessarily bitwise.
    np.testing.assert_allclose(run.scalars.loss, reference.loss, rtol=1e-4)
    np.testing.assert_allclose(run.scalars.grad_norm, reference.grad_norm, rtol=1e-3)
    # The first step's loss comes from identical weights and batch; any layout gets it to ~1 ulp.
    assert run.scalars.loss.iloc[0] == pytest.approx(reference.loss.iloc[0], rel=1e-6)


def test_four_rank_store_reads_like_a_one_rank_store(runs: Runs) -> None:
    one, four = open_run(runs.get("base")), open_run(runs.get("tp2pp2", **LAYOUTS["tp2pp2"]))
    assert list(four.scalars.columns) == list(one.scalars.columns)
    assert four.dataset().sizes == one.dataset().sizes
    assert (four.path / "logs" / "rank3.log").is_file()

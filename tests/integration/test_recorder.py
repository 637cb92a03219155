"""Recording on real multi-process runs: layout-independent sites, exact merges, snapshots."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.training import LAYOUTS, Runs
from workbench.errors import NoSitesError
from workbench.runner.checkpoint import load_full_params
from workbench.statistics import STAT_NAMES, fingerprint_reference, stats_reference
from workbench.store.reader import open_run

SNAPSHOT = {"record.snapshot_steps": [1], "record.snapshot_sites": ["param:output_layer.weight",
                                                                   "act:output_layer", "grad:*word_embeddings*"]}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_records_the_same_sites_in_the_same_order(runs: Runs, name: str) -> None:
    reference = open_run(runs.get("base")).site_table()
    other = open_run(runs.get(name, **LAYOUTS[name])).site_table()
    assert list(other.index) == list(reference.index)
    assert (other["shape"] == reference["shape"]).all()
    # the runner trains with Megatron's optimizer: its Adam moments are found for every parameter
    params = set(other.loc[other["kind"] == "param", "name"])
    for kind in ("exp_avg", "exp_avg_sq"):
        assert set(other.loc[other["kind"] == kind, "name"]) == params, kind


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_merged_parameter_fingerprints_equal_the_single_rank_ones_at_step_0(runs: Runs, name: str) -> None:
    reference = open_run(runs.get("base")).fingerprints()
    other = open_run(runs.get(name, **LAYOUTS[name])).fingerprints()
    params = [s for s in reference.columns if s.startswith("param:")]
    assert len(params) > 10
    assert (other.loc[0, params] == reference.loc[0, params]).all()


def test_data_parallel_forward_and_backward_are_bitwise_those_of_one_rank(runs: Runs) -> None:
    # DP=2 splits the batch but computes each sample alike: activations, loss and activation
    # gradients match bitwise; the first difference is the all-reduced parameter gradient.
    one = open_run(runs.get("base")).fingerprints().loc[0]
    two = open_run(runs.get("dp2", **LAYOUTS["dp2"])).fingerprints().loc[0]
    differing = [s for s in one.index if one[s] != two[s]]
    assert differing, "a DP=2 run reduces gradients in another order"
    assert differing[0].startswith("grad:")
    assert all(one[s] == two[s] for s in one.index if s.split(":")[0] in ("act", "loss", "act_grad"))


def test_tensor_parallel_first_difference_is_a_reduced_activation(runs: Runs) -> None:
    one = open_run(runs.get("base")).fingerprints().loc[0]
    tp = open_run(runs.get("tp2", **LAYOUTS["tp2"])).fingerprints().loc[0]
    first = next(s for s in one.index if one[s] != tp[s])
    assert first == "act:layers.0.self_attention"  # the first row-parallel all-reduce


def test_deterministic_pair_has_equal_fingerprints_nondeterministic_pair_first_differs_in_the_embedding_grad(
        runs: Runs) -> None:
    a, b = open_run(runs.get("base")).fingerprints(), open_run(runs.get("base-repeat")).fingerprints()
    assert a.equals(b)
    c = open_run(runs.get("nondet-a", deterministic=False)).fingerprints()
    d = open_run(runs.get("nondet-b", deterministic=False)).fingerprints()
    step0 = [s for s in c.columns if c.loc[0, s] != d.loc[0, s]]
    assert step0[0] == "grad:embedding.word_embeddings.weight"


def test_stats_and_fingerprints_of_merged_shards_equal_those_of_the_gathered_tensor(runs: Runs) -> None:
    run = open_run(runs.get("tp2-snap", **LAYOUTS["tp2"], **SNAPSHOT))
    stats = run.sites().stats.sel(step=1).load()
    fingerprints = run.fingerprints().loc[1]
    for site in ["param:output_layer.weight", "act:output_layer", "grad:embedding.word_embeddings.weight"]:
        full = run.snapshot(1, site)
        assert np.isfinite(full).all(), f"{site}: snapshot has unwritten regions"
        recorded = stats.sel(site=site).to_numpy()
        expected = stats_reference(full, "fp32")
        exact = [STAT_NAMES.index(n) for n in ("count", "min", "max", "absmax", "nan", "inf", "zero")]
        np.testing.assert_array_equal(recorded[exact], expected[exact], err_msg=site)
        np.testing.assert_allclose(recorded, expected, rtol=1e-9, err_msg=site)
        assert int(fingerprints[site]) == fingerprint_reference(full.astype(np.float32)), site
    # Each piece is its own chunk (one micro-batch x one vocabulary shard): no two writers share one.
    import zarr

    logits = zarr.open_array(run.paths.store / "snapshots/step_000001/act/output_layer", mode="r")
    assert logits.shape == (8, 32, 128) and logits.chunks == (2, 32, 64)
    # The parameter snapshot is the full tensor the checkpoint reassembles from its shards.
    params = load_full_params(run.path / "checkpoints" / "step_000001")
    np.testing.assert_array_equal(run.snapshot(1, "param:output_layer.weight"), params["output_layer.weight"].numpy())


def test_fused_and_eager_statistics_give_the_same_fingerprints(runs: Runs) -> None:
    # compile = true is the native kernel on CPU; the eager path is plain torch.
    eager = open_run(runs.get("base")).fingerprints()
    compiled = open_run(runs.get("compiled", **{"record.compile": True})).fingerprints()
    assert compiled.equals(eager)


def test_recorder_time_is_recorded_and_recording_can_be_off(runs: Runs) -> None:
    assert (open_run(runs.get("base")).scalars.recorder_time > 0).all()
    off = open_run(runs.get("off", **{"record.enabled": False}))
    assert (off.scalars.recorder_time == 0).all()
    with pytest.raises(NoSitesError, match="no per-site records"):
        off.sites()


def test_every_nth_step_and_kind_filters(runs: Runs) -> None:
    run = open_run(runs.get("sparse", **{"record.every": 2, "record.kinds": ["param", "grad"],
                                         "record.sites": ["*layers.1.*", "*output_layer*"]}))
    assert list(run.fingerprints().index) == [0, 2]
    kinds = set(run.site_table()["kind"])
    assert kinds == {"param", "grad"}
    assert all("layers.1." in s or "output_layer" in s for s in run.site_table().index)


def test_snapshot_of_a_parameter_matches_between_layouts(runs: Runs) -> None:
    one = open_run(runs.get("base-snap", **SNAPSHOT)).snapshot(1, "param:output_layer.weight")
    two = open_run(runs.get("tp2-snap", **LAYOUTS["tp2"], **SNAPSHOT)).snapshot(1, "param:output_layer.weight")
    assert one.shape == two.shape == (128, 64)
    assert not np.array_equal(one, np.zeros_like(one))
    np.testing.assert_allclose(one, two, rtol=1e-4, atol=1e-6)
    assert torch.from_numpy(one).dtype == torch.float32

"""MoE with expert parallelism, sequence parallelism and the virtual pipeline against their reference runs.

Every layout starts from the same weights (step-0 checkpoints equal the one-process run's); the first
site two layouts differ at is the one the layout changes: an expert's gradient under EP (its tokens
come from two ranks in one GEMM), a sequence-parallel parameter's gradient under SP (a partial sum over
the sequence), nothing at all under the virtual pipeline (it only reorders the schedule).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.training import Runs, tiny_config
from workbench.analysis.compare import compare
from workbench.analysis.resume import resume_check
from workbench.runner.checkpoint import load_full_params
from workbench.runner.launch import launch
from workbench.store.reader import open_run

MOE = {"model.num_experts": 4, "model.moe_topk": 2, "model.ffn_hidden_size": 64}
MOE_LAYOUTS = {
    "moe-dp2": {"layout.dp": 2},
    "moe-ep2": {"layout.dp": 2, "layout.ep": 2},
    "moe-tp2-sp-ep2": {"layout.tp": 2, "layout.sp": True, "layout.dp": 2, "layout.ep": 2},
}
L4 = {"model.num_layers": 4}


def moe_run(runs: Runs, name: str):  # type: ignore[no-untyped-def]
    return runs.get(name, **MOE, **MOE_LAYOUTS.get(name, {}))


@pytest.mark.parametrize("name", list(MOE_LAYOUTS))
def test_expert_parallel_layouts_start_from_the_one_process_weights(runs: Runs, name: str) -> None:
    reference = load_full_params(moe_run(runs, "moe") / "checkpoints" / "step_000000")
    other = load_full_params(moe_run(runs, name) / "checkpoints" / "step_000000")
    # experts by global index, whichever EP rank held them
    assert {n for n in other if ".experts." in n} >= {f"layers.1.mlp.experts.{e}.linear_fc1.weight" for e in range(4)}
    assert sorted(other) == sorted(reference)
    for site, tensor in reference.items():
        assert torch.equal(other[site], tensor), site


@pytest.mark.parametrize("name", list(MOE_LAYOUTS))
def test_expert_parallel_layouts_train_the_same_model(runs: Runs, name: str) -> None:
    reference = open_run(moe_run(runs, "moe")).scalars
    run = open_run(moe_run(runs, name))
    assert run.status == "complete"
    np.testing.assert_allclose(run.scalars.loss, reference.loss, rtol=1e-4)
    # the norm sums every expert once (each held by one rank of an EP group)
    np.testing.assert_allclose(run.scalars.grad_norm, reference.grad_norm, rtol=1e-3)


def test_expert_parallelism_first_changes_an_experts_gradient(runs: Runs) -> None:
    dp2, ep2 = (open_run(moe_run(runs, n)) for n in ("moe-dp2", "moe-ep2"))
    result = compare(dp2.records(), ep2.records())
    assert result.first_step == 0
    # everything before the experts (embedding, attention, router) is computed alike on both
    assert ".experts." in str(result.first_site), result.first_site
    assert result.equal.loc[0, "act:layers.0.mlp.router"]


@pytest.mark.parametrize("name", ["moe", "moe-ep2", "moe-tp2-sp-ep2"])
def test_moe_sites_hold_every_token_once(runs: Runs, name: str) -> None:
    run = open_run(moe_run(runs, name))
    cfg = run.config
    tokens = cfg.global_batch_size * cfg.model.seq_length
    sums, counts, zeros = run.stat("sum"), run.stat("count"), run.stat("zero")
    for layer in range(cfg.model.num_layers):
        mlp = f"layers.{layer}.mlp"
        # tokens routed per expert per micro-batch: top-k routes of every token of the step
        assert (sums[f"act:{mlp}.tokens_per_expert"] == tokens * cfg.model.moe_topk).all()
        micro_batches = cfg.global_batch_size // cfg.micro_batch_size  # of the step, over all DP ranks
        assert (counts[f"act:{mlp}.tokens_per_expert"] == micro_batches * cfg.model.num_experts).all()
        assert (counts[f"act:{mlp}.router"] == tokens * cfg.model.num_experts).all()
        # each expert's output is a full [samples, seq, hidden] tensor, non-zero where a token was routed to it
        experts = [f"act:{mlp}.experts.{e}" for e in range(cfg.model.num_experts)]
        hidden = cfg.model.hidden_size
        assert all((counts[e] == tokens * hidden).all() for e in experts)
        routed_elements = sum(counts[e] - zeros[e] for e in experts)
        assert (routed_elements == tokens * cfg.model.moe_topk * hidden).all()
        aux = sums[f"loss:{mlp}.aux_loss"]
        assert np.isfinite(aux).all() and (aux > 0).all()


def test_moe_sites_agree_between_layouts(runs: Runs) -> None:
    one, ep = (open_run(moe_run(runs, n)) for n in ("moe", "moe-tp2-sp-ep2"))
    a, b = one.stat("l2"), ep.stat("l2")
    sites = [s for s in a.columns if fnmatch.fnmatch(s, "*:layers.*.mlp.*")]
    assert len(sites) == len(b.columns.intersection(sites)) > 0
    # step 0: same weights, same tokens; the layouts' reductions differ only by rounding
    np.testing.assert_allclose(b.loc[0, sites], a.loc[0, sites], rtol=1e-4)


def test_the_emulated_token_combine_changes_the_moe_output_first(runs: Runs) -> None:
    nondet = {**MOE, "model.moe_topk": 3, "deterministic": False, "nondeterminism.embedding_atomics": False}
    a, b = (open_run(runs.get(n, **nondet)) for n in ("moe-nondet-a", "moe-nondet-b"))
    assert any("unpermute" in e for e in a.attrs["determinism"]["emulated_nondeterminism"])
    assert a.attrs["determinism"]["sources"]["moe_token_combine"]["state"] == "on"
    result = compare(a.records(), b.records())
    # three expert outputs meet in each token, added in a random order: the layer's output is the first to change
    assert (result.first_step, result.first_site) == (0, "act:layers.0.mlp")


def test_sequence_parallelism_first_changes_a_sequence_parallel_gradient(runs: Runs) -> None:
    tp2, sp = (open_run(runs.get(n, **o)) for n, o in (("tp2", {"layout.tp": 2}),
                                                        ("tp2-sp", {"layout.tp": 2, "layout.sp": True})))
    reference = load_full_params(runs.get("base") / "checkpoints" / "step_000000")
    start = load_full_params(sp.path / "checkpoints" / "step_000000")
    assert sorted(start) == sorted(reference) and all(torch.equal(start[n], reference[n]) for n in reference)
    result = compare(tp2.records(), sp.records())
    assert result.first_step == 0
    # the forward is the same (each TP rank normalises its half of the sequence); the norms' and the
    # row-parallel biases' gradients are now sums over the two halves
    assert all(result.equal.loc[0, s] for s in result.common_sites if s.startswith("act:")), result.first_site
    assert fnmatch.fnmatch(str(result.first_site), "grad*:*layernorm*") or str(result.first_site).endswith(".bias")


def test_the_virtual_pipeline_reorders_the_schedule_only(runs: Runs) -> None:
    pp2 = open_run(runs.get("l4-pp2", **L4, **{"layout.pp": 2}))
    vp2 = open_run(runs.get("l4-pp2-vp2", **L4, **{"layout.pp": 2, "layout.vp": 2}))
    assert vp2.attrs["layout"]["vp"] == 2 and vp2.status == "complete"
    # each rank holds layers (0, 2) or (1, 3) and runs the interleaved 1F1B: the same operations on the same
    # micro-batches in another order, so every tensor of the step's forward and backward is bitwise the same;
    # Megatron's optimizer then sums the squared gradient norm over its parameter groups, which hold the two
    # chunks' parameters in another order: the norm moves in its last bits, and with it the clipped update
    result = compare(pp2.records(), vp2.records())
    assert result.first_step == 0 and str(result.first_site).startswith("exp_avg:"), result.first_site
    steps_before = [s for s in result.common_sites if s.split(":")[0] in ("param", "act", "act_grad", "grad", "loss")]
    assert len(steps_before) > 20 and all(result.equal.loc[0, s] for s in steps_before)
    a, b = pp2.scalars["grad_norm"].to_numpy(), vp2.scalars["grad_norm"].to_numpy()
    assert np.abs(a[0] - b[0]) <= 1e-6 * a[0]


def test_an_expert_parallel_run_resumes_bitwise(runs: Runs, tmp_path: Path) -> None:
    uninterrupted = moe_run(runs, "moe-ep2")
    cfg = tiny_config("moe-ep2-resumed", **MOE, **MOE_LAYOUTS["moe-ep2"])
    launch(cfg, tmp_path / "resumed", stop_after=2)
    launch(cfg, tmp_path / "resumed", resume=True)  # each EP rank reloads its own experts
    check = resume_check(open_run(tmp_path / "resumed").records(), open_run(uninterrupted).records())
    assert check.from_step == 2 and check.identical, check.summary()

"""megatron-core's HybridModel (0.18+) recorded by ``record`` from a user loop (``user_loop.py --model hybrid``):
pattern ``"*-*-"`` of ``hybrid_local_spec()`` at TP=2, its sites in the GPT spelling (``workbench.sites``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("megatron.core.models.hybrid", reason="megatron-core before 0.18 has no HybridModel")

from tests.helpers.training import train_user_loop  # noqa: E402
from workbench.analysis.compare import compare  # noqa: E402
from workbench.store.reader import open_run  # noqa: E402

ALL_KINDS = {"param", "act", "act_grad", "grad", "loss", "exp_avg", "exp_avg_sq", "update"}
HYBRID_ONLY = {f"{kind}:layers.{n}.attention_residual" for kind in ("act", "act_grad") for n in (0, 1)}


@pytest.fixture(scope="module")
def hybrid_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HybridModel at TP=2 twice, once with one flipped bit in block 0's MLP (Megatron layer 1) at step 2. The
    GPTModel of the same two blocks at TP=2 is ``user_runs``' ``tp2`` (``user_loop.py --model gpt --tp 2``)."""
    root = tmp_path_factory.mktemp("hybrid-runs")
    train_user_loop(root / "hybrid", "--model", "hybrid", "--tp", "2")
    train_user_loop(root / "hybrid-again", "--model", "hybrid", "--tp", "2")
    train_user_loop(root / "hybrid-flip", "--model", "hybrid", "--tp", "2", "--flip", "2:decoder.layers.1.mlp")
    return root


def test_every_kind_is_recorded_from_a_tp2_hybrid_loop_in_the_gpt_spelling(hybrid_runs: Path) -> None:
    run = open_run(hybrid_runs / "hybrid")
    assert run.status == "complete" and run.steps_completed == 4
    assert set(run.site_table()["kind"]) == ALL_KINDS
    assert "kinds_missing" not in run.attrs
    assert run.manifest.user_config is not None and run.manifest.user_config["model"] == "hybrid"
    assert run.manifest.model is not None and run.manifest.model.num_layers == 2  # GPT blocks, config.num_layers is 4
    sites = set(run.records().sites)
    assert HYBRID_ONLY <= sites
    assert {"act:layers.1", "act:layers.1.mlp", "param:layers.1.pre_mlp_layernorm.weight",
            "param:final_layernorm.weight", "act:final_layernorm"} <= sites
    assert not any(".layers.2" in s or ":layers.2" in s or ":layers.3" in s or "final_norm" in s for s in sites)


def test_two_hybrid_runs_are_bitwise_identical(hybrid_runs: Path) -> None:
    again = open_run(hybrid_runs / "hybrid-again").records()
    assert compare(open_run(hybrid_runs / "hybrid").records(), again).identical


def test_a_one_bit_change_in_a_hybrid_mlp_layer_is_found_at_its_step_and_block(hybrid_runs: Path) -> None:
    result = compare(open_run(hybrid_runs / "hybrid").records(), open_run(hybrid_runs / "hybrid-flip").records())
    assert (result.first_step, result.first_site) == (2, "act:layers.0.mlp")


def test_a_hybrid_model_and_the_gpt_model_of_its_blocks_line_up_site_for_site(hybrid_runs: Path,
                                                                               user_runs: Path) -> None:
    gpt, hybrid = open_run(user_runs / "tp2").records(), open_run(hybrid_runs / "hybrid").records()
    assert open_run(user_runs / "tp2").manifest.user_config["model"] == "gpt"  # type: ignore[index]
    result = compare(gpt, hybrid)
    assert set(result.common_sites) == set(gpt.sites)  # every GPT site has its Hybrid namesake
    assert result.only_in_a["sites"] == [] and set(result.only_in_b["sites"]) == HYBRID_ONLY
    # is_hybrid_model gives GPTModel's output-layer init, so the two compute the same numbers
    assert result.identical

"""Megatron-LM's tensor dumps, written by megatron.training's own functions from a Megatron Core loop
(``user_loop.py --megatron-dumps``: activations and dgrads hooked around the forward-backward, wgrads after the
reduction, params after the step, as ``train_step`` writes them), imported by ``workbench
import-megatron-dumps``: at TP=2 and PP=2, twins compare identical, a one-bit change is found at its step and
module, and the import agrees bit for bit with the recorder's store of the same run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("megatron.training.activation_logging", reason="megatron-core before 0.17 writes no dumps")

from tests.helpers.training import train_user_loop  # noqa: E402
from workbench.analysis.compare import compare  # noqa: E402
from workbench.cli import main  # noqa: E402
from workbench.store.reader import open_run  # noqa: E402
from workbench.store.records import RunRecords  # noqa: E402

ONE_MICRO_BATCH = ("--micro-batches", "1")  # a dump keeps the last micro-batch: with one, it is the recorder's


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TP=2 twice and once with one flipped bit in layer 1's linear_fc1 at step 2; PP=2 once and once with the
    bit flipped in each stage's first linear_fc1 (global layers 0 and 1) at step 2; each imported."""
    root = tmp_path_factory.mktemp("megatron-dumps")
    runs = {"tp2": ("--tp", "2"), "tp2-again": ("--tp", "2"),
            "tp2-flip": ("--tp", "2", "--flip", "2:decoder.layers.1.mlp.linear_fc1"),
            "pp2": ("--pp", "2"), "pp2-flip": ("--pp", "2", "--flip", "2:decoder.layers.0.mlp.linear_fc1")}
    for name, layout in runs.items():
        train_user_loop(root / name, *layout, *ONE_MICRO_BATCH, "--megatron-dumps", str(root / "save" / name))
        assert main(["import-megatron-dumps", str(root / "save" / name), "--out", str(root / "imported" / name)]) == 0
    return root


def _imported(dumps: Path, name: str) -> RunRecords:
    return open_run(dumps / "imported" / name).records()


def test_an_import_has_the_recorders_site_names_and_says_what_a_dump_cannot_show(dumps: Path) -> None:
    run = open_run(dumps / "imported" / "tp2")
    assert run.status == "complete" and run.manifest.producer == "import: megatron-lm dumps"
    assert (run.manifest.layout.tp, run.manifest.layout.pp) == (2, 1)
    imported = run.attrs["imported"]
    assert imported["iterations"] == {kind: [1, 2, 3, 4] for kind in ("params", "activations", "dgrads", "wgrads")}
    assert any("last micro-batch" in limit for limit in imported["limits"])
    records = run.records()
    assert records.steps == [0, 1, 2, 3, 4]  # params of iter_4 are step 4's start; the rest of iter_N is step N-1
    sites = set(records.sites)
    assert {"param:layers.1.self_attention.linear_qkv.weight", "grad:output_layer.weight",
            "act:layers.0.self_attention", "act:layers.1.mlp", "act:output_layer",
            "act:layers.0.self_attention.linear_qkv", "act:layers.0.self_attention.linear_qkv/input0",
            "act_grad:layers.1.mlp", "act_grad:layers.0.mlp.linear_fc1/input0"} <= sites
    assert not any("decoder." in s or "model_chunk" in s for s in sites)
    checks = open_run(dumps / "tp2").manifest.runtime["megatron_determinism"]  # the recorded run: 0.19's checks
    assert isinstance(checks["passes"], bool) and isinstance(checks["failing"], list)
    order = list(records.sites)  # a module's input before its output, in the forward; the reverse in the backward
    assert order.index("act:layers.0.mlp.linear_fc1/input0") < order.index("act:layers.0.mlp.linear_fc1") < \
        order.index("act:layers.1.self_attention.linear_qkv/input0")
    assert order.index("act_grad:layers.1.mlp") < order.index("act_grad:layers.0.mlp")


def test_two_dumps_of_one_configuration_compare_identical(dumps: Path) -> None:
    assert compare(_imported(dumps, "tp2"), _imported(dumps, "tp2-again")).identical


@pytest.mark.parametrize(("flipped", "reference", "module"), [
    ("tp2-flip", "tp2", "layers.1.mlp.linear_fc1"), ("pp2-flip", "pp2", "layers.0.mlp.linear_fc1")])
def test_a_one_bit_change_is_found_at_its_step_and_module_with_its_input_equal(
        dumps: Path, flipped: str, reference: str, module: str) -> None:
    a, b = _imported(dumps, reference), _imported(dumps, flipped)
    result = compare(a, b)
    assert (result.first_step, result.first_site) == (2, f"act:{module}")
    inputs = f"act:{module}/input0"
    assert a.fingerprints.at[2, inputs] == b.fingerprints.at[2, inputs]
    assert (a.fingerprints.loc[[0, 1]] == b.fingerprints.loc[[0, 1]]).all().all()


@pytest.mark.parametrize("name", ["tp2", "pp2"])
def test_an_import_and_the_recorders_store_of_the_same_run_agree_bit_for_bit(dumps: Path, name: str) -> None:
    imported, recorded = _imported(dumps, name), open_run(dumps / name).records()
    steps = [s for s in imported.steps if s in set(recorded.steps)]
    sites = [s for s in imported.sites if s in set(recorded.sites)]
    kinds = {s.partition(":")[0] for s in sites}
    assert kinds == {"param", "grad", "act", "act_grad"}
    assert {"act:layers.0.self_attention", "act:layers.1.mlp", "act:output_layer",
            "act_grad:layers.1.self_attention"} <= set(sites)
    mine = imported.fingerprints.loc[steps, sites].to_numpy(dtype=np.uint64)
    theirs = recorded.fingerprints.loc[steps, sites].to_numpy(dtype=np.uint64)
    covered = (mine != 0) & (theirs != 0)  # params are dumped from step 1, the rest up to step 3
    assert covered.sum() >= 200
    assert (mine[covered] == theirs[covered]).all(), [
        (steps[i], sites[j]) for i, j in zip(*np.nonzero(covered & (mine != theirs)), strict=True)][:5]

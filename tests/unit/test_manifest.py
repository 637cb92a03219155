"""The typed run manifest: round trip, schema v1, stores of other producers, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.config import RunConfig
from workbench.errors import DamagedStoreError, ForeignRunError
from workbench.store.manifest import (
    RUNNER,
    ModelSignature,
    ParallelLayout,
    Provenance,
    RunManifest,
    manifest_fields,
    parse_manifest,
    runner_manifest,
)
from workbench.store.reader import list_runs, open_run
from workbench.store.synthetic import write_synthetic_run
from workbench.studies.workspace import Workspace

MODEL = ModelSignature(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128, seq_length=32,
                       parameters=123_456)


def test_a_manifest_reads_back_as_written() -> None:
    info = RunManifest(run_id="x-1", name="x", producer="user loop", model=MODEL,
                       layout=ParallelLayout(tp=2, dp=2, sp=True, ep=2), precision="bf16", deterministic=True,
                       seed=7, determinism={"NCCL_ALGO": "Ring"}, user_config={"lr": 1e-3, "tags": ["a"]})
    assert parse_manifest(json.loads(json.dumps(manifest_fields(info))), source="s") == info
    assert info.summary() == "L2 H64 TP2-PP1-DP2-SP-EP2 bf16 det seed7"
    assert info.layout.world_size == 4


def test_a_band_runs_perturbation_and_a_parting_of_replicas_read_back() -> None:
    info = RunManifest(run_id="x-1", name="x", producer="user loop", model=MODEL,
                       perturbation={"precision": "bf16", "relative_size": 2.0 ** -8, "modules": 9})
    attrs = manifest_fields(info)
    assert parse_manifest(attrs, source="s") == info
    attrs.update(replicas_parted={"step": 0, "site": "grad:final_layernorm.weight", "tp_rank": 1},
                 git_revision="abc123")
    read = parse_manifest(attrs, source="s")
    assert read.replicas_parted == {"step": 0, "site": "grad:final_layernorm.weight", "tp_rank": 1}
    assert read.revision == "abc123"


def test_the_runners_manifest_and_a_schema_v1_one_say_the_same() -> None:
    cfg = RunConfig.from_dict({"name": "r", "layout": {"tp": 2}, "precision": "bf16", "deterministic": False})
    v2 = parse_manifest(runner_manifest(cfg), source="s")
    assert v2.producer == RUNNER and v2.summary() == cfg.summary() and v2.config == cfg.to_dict()
    v1 = {k: v for k, v in runner_manifest(cfg).items() if k not in ("producer", "model", "deterministic", "seed")}
    v1["layout"] = {"tp": 2, "pp": 1, "dp": 1, "world_size": 2}  # as schema v1 wrote it
    old = parse_manifest(v1, source="s")
    assert (old.producer, old.model, old.layout, old.precision, old.deterministic, old.seed) == \
        (RUNNER, v2.model, v2.layout, "bf16", False, cfg.seed)


@pytest.mark.parametrize("edit, field", [
    (lambda m: m.pop("run_id"), "'run_id'"),
    (lambda m: m["model"].pop("hidden_size"), "'hidden_size'"),
    (lambda m: m["model"].update(num_layers=True), "'num_layers' is bool"),
    (lambda m: m.update(deterministic="yes"), "'deterministic' is str"),
    (lambda m: m["layout"].update(tp="2"), "'tp' is str"),
    (lambda m: m.update(replicas_parted={"step": -1, "site": "grad:x", "tp_rank": 1}), "replicas_parted"),
    (lambda m: m.update(replicas_parted={"step": 3, "site": "grad:x"}), "replicas_parted"),
    (lambda m: m.update(perturbation={"precision": "fp32", "relative_size": 0.0}), "perturbation"),
])
def test_a_missing_or_mistyped_field_is_named(edit, field: str) -> None:  # type: ignore[no-untyped-def]
    attrs = manifest_fields(RunManifest(run_id="x-1", name="x", producer="user loop", model=MODEL))
    edit(attrs)
    with pytest.raises(DamagedStoreError, match=field):
        parse_manifest(attrs, source="RUN/run.zarr")


def _user_loop_store(run_dir: Path, seed: int, diverge_at: tuple[int, int] | None = None) -> Path:
    """A store whose manifest is what a user's own loop writes: no workbench config at all."""
    write_synthetic_run(run_dir, steps=6, sites=10, seed=seed, diverge_at=diverge_at)
    meta_path = run_dir / "run.zarr" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    attrs = meta["attributes"]
    for key in ("config", "config_hash", "synthetic", "fault"):
        attrs.pop(key, None)
    attrs.update(manifest_fields(RunManifest(run_id=f"{run_dir.name}-1", name=run_dir.name, producer="user loop",
                                             model=MODEL, precision="fp32", deterministic=True,
                                             user_config={"megatron_args": {"lr": 3e-4}})))
    meta_path.write_text(json.dumps(meta))
    return run_dir


def test_runs_of_another_producer_list_compare_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _user_loop_store(tmp_path / "mine-a", seed=1)
    b = _user_loop_store(tmp_path / "mine-b", seed=1, diverge_at=(3, 4))
    run = open_run(a)
    assert run.manifest.producer == "user loop" and run.manifest.user_config == {"megatron_args": {"lr": 3e-4}}
    with pytest.raises(ForeignRunError, match="not by the workbench runner"):
        run.config  # noqa: B018
    assert list(list_runs(tmp_path).config) == ["L2 H64 TP1-PP1-DP1 fp32 det", "L2 H64 TP1-PP1-DP1 fp32 det"]
    assert main(["compare", str(a), str(b), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["first_step"] == 3
    assert main(["check", str(b), "--golden", str(a)]) == 1
    capsys.readouterr()
    assert main(["summary", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "mine-b vs mine-a: first differ at step 3" in printed
    assert main(["study", str(tmp_path)]) == 0 and capsys.readouterr().out == printed  # the verb's former name
    ws = Workspace.open(tmp_path)
    assert ws.roles.reference == "mine-a" and ws.runs["mine-a"].manifest.configuration() == "L2 H64 TP1-PP1-DP1 fp32"
    assert main(["replay", str(a), "--step", "1"]) == 2
    assert "not by the workbench runner" in capsys.readouterr().err


def test_the_live_manifest_reads_the_process_and_the_config() -> None:
    from types import SimpleNamespace

    import torch

    from workbench.recorder.session import live_determinism, live_layout, live_precision
    from workbench.store.manifest import ParallelLayout

    config = SimpleNamespace(deterministic_mode=True, cross_entropy_loss_fusion=False, bf16=False, fp16=False,
                             params_dtype=torch.float32, sequence_parallel=False)
    assert live_layout(config) == ParallelLayout()  # parallel_state not initialised: one process
    assert live_precision(config) == "fp32"
    assert live_precision(SimpleNamespace(bf16=True)) == "bf16"
    assert live_precision(SimpleNamespace(bf16=False, fp16=False, params_dtype=torch.float16)) == "fp16"
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        switches = live_determinism(config)
        assert switches["deterministic"] is False and switches["torch_use_deterministic_algorithms"] is False
        assert switches["transformer_config"] == {"deterministic_mode": True, "cross_entropy_loss_fusion": False}
        torch.use_deterministic_algorithms(True)
        assert live_determinism(config)["deterministic"] is True
        assert live_determinism(SimpleNamespace(deterministic_mode=False))["deterministic"] is False
    finally:
        torch.use_deterministic_algorithms(before)


def test_a_v1_layout_and_its_v2_form_are_the_same_layout() -> None:
    from workbench.store.manifest import ParallelLayout, parse_layout

    v1 = {"tp": 2, "pp": 1, "dp": 2, "world_size": 4}
    v2 = {"tp": 2, "pp": 1, "dp": 2, "cp": 1, "ep": 1, "sp": False, "vp": None, "world_size": 4}
    assert parse_layout(v1, "a") == parse_layout(v2, "b") == ParallelLayout(tp=2, dp=2)
    assert parse_layout(v1, "a") != parse_layout({**v2, "ep": 2}, "b")


def test_a_provenance_footer_names_every_revision_its_runs_were_made_with() -> None:
    two = Provenance(runs=("a-1",), configs=("L1 H8 fp32",), schema_version=2,
                     revision="abcdef0123456789, 0123456789abcdef")
    assert two.lines()[1].endswith("revision abcdef012345, 0123456789ab")
    unknown = Provenance(runs=("a-1",), configs=(), schema_version=2, revision=None)
    assert unknown.lines()[1].endswith("revision unknown")

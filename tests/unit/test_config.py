from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from workbench.config import Precision, RunConfig, load_run_config
from workbench.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "workbench" / "examples"


def test_example_configs_load() -> None:
    cfg = load_run_config(EXAMPLES / "tiny.toml")
    assert cfg.name == "tiny"
    assert cfg.precision is Precision.FP32
    assert cfg.num_microbatches == cfg.global_batch_size // cfg.micro_batch_size


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"precision": "fp64"}, "precision"),
        ({"layout.tp": 3}, "layout.tp"),
        ({"layout.pp": 3}, "layout.pp"),
        ({"layout.dp": 0}, "layout.dp"),
        ({"global_batch_size": 9}, "global_batch_size"),
        ({"model.hidden_size": 65}, "model.hidden_size"),
        ({"optim.min_lr": 1.0}, "optim.min_lr"),
        ({"steps": 2.5}, "steps"),
        ({"name": "has space"}, "name"),
        ({"deterministic": "yes"}, "deterministic"),
        ({"eval.samples": 3}, "eval.samples"),
        ({"eval.every": -1}, "eval.every"),
        ({"fault.kind": "melt"}, "fault.kind"),
        ({"fault.kind": "bitflip", "fault.site": "layers.0.mlp"}, "fault.site"),
        ({"fault.kind": "bitflip", "fault.site": "act:layers.0.mlp", "fault.bit": 32}, "fault.bit"),
        ({"fault.kind": "scale", "fault.site": "grad:output_layer.weight", "fault.step": 40}, "fault.step"),
    ],
)
def test_bad_values_name_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        RunConfig(name="x").with_overrides(overrides)


def test_bad_precision_lists_allowed_values() -> None:
    with pytest.raises(ConfigError, match="'fp32', 'bf16', 'fp16', 'fp8'"):
        RunConfig.from_dict({"name": "x", "precision": "int4"})


def test_unknown_fields_are_rejected_with_the_allowed_ones(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('name = "x"\n[model]\nhidden = 3\n')
    with pytest.raises(ConfigError, match=r"c\.toml.*model\.hidden.*model\.hidden_size"):
        load_run_config(path)


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_run_config(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_run_config(bad)


def test_round_trip_and_hash() -> None:
    cfg = RunConfig(name="a").with_overrides({"layout.tp": 2, "precision": "bf16"})
    again = RunConfig.from_dict(cfg.to_dict())
    assert again == cfg
    assert cfg.numerics_hash() == cfg.with_overrides({"name": "b", "flush_every": 3}).numerics_hash()
    assert cfg.numerics_hash() != cfg.with_overrides({"seed": 7}).numerics_hash()


def test_override_of_unknown_key() -> None:
    with pytest.raises(ConfigError, match="does not name a config field"):
        RunConfig(name="a").with_overrides({"layout.cp": 2})


def test_integers_are_accepted_for_float_fields() -> None:
    cfg = RunConfig.from_dict({"name": "a", "optim": {"lr": 1, "min_lr": 0}})
    assert isinstance(cfg.optim.lr, float) and cfg.optim.lr == 1.0


def test_fault_is_part_of_the_numerics_but_no_fault_keeps_the_old_hash() -> None:
    plain = RunConfig(name="x")
    faulted = plain.with_overrides({"fault.kind": "bitflip", "fault.site": "act:layers.0.mlp", "fault.step": 3})
    assert faulted.numerics_hash() != plain.numerics_hash()
    assert "fault" not in plain.to_dict() or plain.to_dict()["fault"]["kind"] == "none"
    # The hash of a config without a fault is what it was before faults existed (stores keep resuming):
    # the value computed by the workbench before the fault section was added.
    assert plain.numerics_hash() == "54e7cd310dc75613"
    assert faulted.fault.describe() == "flip bit 30 of element 0 of act:layers.0.mlp at step 3"


def test_evaluation_is_after_every_nth_step_and_the_last_and_shapes_no_number() -> None:
    from workbench.config import EvalConfig

    assert [s for s in range(12) if EvalConfig(every=5).after(s, 12)] == [4, 9, 11]
    assert not any(EvalConfig(every=0).after(s, 12) for s in range(12))
    cfg = RunConfig(name="a")
    assert cfg.with_overrides({"eval.every": 1}).numerics_hash() == cfg.numerics_hash()
    assert cfg.with_overrides({"seed": 7}).numerics_hash(seed=False) == cfg.numerics_hash(seed=False)
    assert cfg.with_overrides({"seed": 7}).numerics_hash() != cfg.numerics_hash()


def test_nondeterminism_sources_are_switched_by_name_and_checked() -> None:
    from workbench.config import NondeterminismConfig
    from workbench.determinism import SOURCES

    assert [f.name for f in dataclasses.fields(NondeterminismConfig)] == list(SOURCES)
    base = RunConfig(name="x", deterministic=False)
    splitk = RunConfig.from_dict({"name": "x", "deterministic": False, "nondeterminism": {"splitk_gemm": True}})
    assert splitk.nondeterminism.requested() == {"splitk_gemm": True}
    assert splitk.numerics_hash() != base.numerics_hash()
    assert RunConfig.from_dict({**base.to_dict(), "nondeterminism": {}}).numerics_hash() == base.numerics_hash()
    with pytest.raises(ConfigError, match="deterministic = true turns every source off"):
        RunConfig.from_dict({"name": "x", "nondeterminism": {"attention_backward": True}})
    with pytest.raises(ConfigError, match="layout.dp = 2: a sum of two contributions commutes exactly"):
        RunConfig.from_dict({"name": "x", "deterministic": False, "layout": {"dp": 2},
                             "nondeterminism": {"dp_allreduce": True}})
    with pytest.raises(ConfigError, match="nondeterminism.splitk_gemm = 'yes' is not allowed: true or false"):
        RunConfig.from_dict({"name": "x", "deterministic": False, "nondeterminism": {"splitk_gemm": "yes"}})
    RunConfig.from_dict({"name": "x", "deterministic": True, "nondeterminism": {"splitk_gemm": False}})  # fine
    RunConfig.from_dict({"name": "x", "layout": {"dp": 3}, "global_batch_size": 12, "eval": {"every": 0}})


def test_a_config_that_is_not_utf8_is_one_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('name = "caf\u00e9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="not a UTF-8 text file"):
        load_run_config(path)


@pytest.mark.parametrize("field", ["seed", "data.seed"])
def test_a_seed_beyond_63_bits_is_refused_before_anything_runs(tmp_path: Path, field: str) -> None:
    path = tmp_path / "seed.toml"
    line = f"seed = {2**64}\n" if field == "seed" else f"[data]\nseed = {2**64}\n"
    path.write_text('name = "s"\n' + line)
    with pytest.raises(ConfigError, match=r"2\*\*63 - 1"):
        load_run_config(path)
    path.write_text('name = "s"\n' + line.replace(str(2**64), str(2**63 - 1)))
    assert load_run_config(path).name == "s"


def test_a_run_of_more_steps_than_a_store_can_plan_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "long.toml"
    path.write_text(f'name = "long"\nsteps = {10**12}\n')
    with pytest.raises(ConfigError, match="steps = 1000000000000.*at most 100,000,000"):
        load_run_config(path)


def test_a_layout_bug_is_named_and_needs_the_layout_it_lives_in() -> None:
    from workbench.config import LAYOUT_BUGS

    bugged = RunConfig.from_dict({"name": "b", "layout": {"tp": 2}, "fault": {"kind": "layout_bug",
                                                                             "bug": "replica_not_updated"}})
    assert bugged.fault.describe() == f"layout bug replica_not_updated: {LAYOUT_BUGS['replica_not_updated']}"
    assert bugged.numerics_hash() != bugged.with_overrides({"fault.kind": "none"}).numerics_hash()
    with pytest.raises(ConfigError, match="fault.bug = 'nope' is not allowed: one of tp_partial_scale"):
        RunConfig.from_dict({"name": "b", "layout": {"tp": 2}, "fault": {"kind": "layout_bug", "bug": "nope"}})
    with pytest.raises(ConfigError, match=r"layout.tp >= 2 and layout.pp = 1 \(and layout.sp for sp_norm"):
        RunConfig.from_dict({"name": "b", "fault": {"kind": "layout_bug", "bug": "tp_partial_scale"}})
    with pytest.raises(ConfigError, match="fault.bug = 'sp_norm_unreduced'"):
        RunConfig.from_dict({"name": "b", "layout": {"tp": 2}, "fault": {"kind": "layout_bug",
                                                                         "bug": "sp_norm_unreduced"}})
    # a fault that is no layout bug keeps the hash it had before layout bugs existed: the value the workbench
    # computed then (f9d25bb)
    flip = RunConfig.from_dict({"name": "f", "fault": {"kind": "bitflip", "site": "act:layers.1.mlp", "step": 3}})
    assert "bug" in flip.to_dict()["fault"] and flip.numerics_hash() == "92faf9cfaf1a8348"

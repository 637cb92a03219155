from __future__ import annotations

from workbench import determinism


def test_deterministic_environment_sets_every_switch() -> None:
    env = determinism.rank_environment(True, base={"PATH": "/bin"})
    assert env["NCCL_ALGO"] == "Ring"
    assert env["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == "0"
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert env["PATH"] == "/bin"


def test_nondeterministic_environment_drops_inherited_switches() -> None:
    env = determinism.rank_environment(False, base={"NCCL_ALGO": "Ring", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    assert "NCCL_ALGO" not in env and "CUBLAS_WORKSPACE_CONFIG" not in env


def test_transformer_config_flags() -> None:
    assert determinism.transformer_config_flags(True) == {"deterministic_mode": True,
                                                          "cross_entropy_loss_fusion": False}
    assert determinism.transformer_config_flags(False) == {"deterministic_mode": False}


def test_describe_records_emulation() -> None:
    record = determinism.describe(False, ["embedding grad"])
    assert record["emulated_nondeterminism"] == ["embedding grad"]
    assert record["required_env"] == {}
    assert "NCCL_ALGO" in record["env"]

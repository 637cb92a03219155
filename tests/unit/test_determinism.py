from __future__ import annotations

import pytest

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


def test_deterministic_mode_turns_every_source_off_and_cpu_defaults_to_the_embedding_alone() -> None:
    from workbench.determinism import SOURCES, SourceState, resolve

    assert set(resolve(True, on_gpu=True).values()) == {SourceState.OFF}
    cpu = resolve(False, on_gpu=False)
    assert [n for n, s in cpu.items() if s is SourceState.ON] == ["embedding_atomics"]
    gpu = resolve(False, on_gpu=True, present=lambda module: False)  # no Transformer Engine
    assert gpu["attention_backward"] is SourceState.UNAVAILABLE  # asked for by default, never recorded as on
    assert {n for n, s in gpu.items() if s is SourceState.ON} == {"embedding_atomics", "splitk_gemm",
                                                                  "dp_allreduce", "torch_algorithms"}
    assert resolve(False, on_gpu=True, present=lambda module: True)["attention_backward"] is SourceState.ON
    alone = resolve(False, {"embedding_atomics": False, "splitk_gemm": True, "torch_algorithms": True}, on_gpu=False)
    assert alone["splitk_gemm"] is SourceState.ON and alone["embedding_atomics"] is SourceState.OFF
    assert alone["torch_algorithms"] is SourceState.UNAVAILABLE  # no CPU emulation
    assert all(s.env is None or s.env[0] in determinism.DETERMINISTIC_ENV for s in SOURCES.values())
    with pytest.raises(ValueError, match="no nondeterminism source 'splitk'"):
        resolve(False, {"splitk": True}, on_gpu=False)


def test_a_gpu_rank_sets_the_variable_of_each_source_that_is_off() -> None:
    from workbench.determinism import resolve

    sources = resolve(False, {"dp_allreduce": False}, on_gpu=True, present=lambda module: True)
    env = determinism.rank_environment(False, base={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, sources=sources)
    assert env["NCCL_ALGO"] == "Ring" and "CUBLAS_WORKSPACE_CONFIG" not in env  # split-K on: inherited one removed
    assert "NVTE_ALLOW_NONDETERMINISTIC_ALGO" not in env
    flags = determinism.transformer_config_flags(False, resolve(False, {"embedding_atomics": False}, on_gpu=False))
    assert flags == {"deterministic_mode": True}
    fused = resolve(False, {"fused_cross_entropy": True}, on_gpu=True)
    assert determinism.transformer_config_flags(False, fused)["cross_entropy_loss_fusion"] is True


def test_the_manifest_record_lists_the_sources_on_and_older_records_are_read_too() -> None:
    from workbench.determinism import resolve, sources_on

    record = determinism.describe(False, ["split-K"], sources=resolve(False, {"embedding_atomics": False,
                                                                            "splitk_gemm": True}, on_gpu=False))
    assert sources_on(record) == ["splitk_gemm"]
    assert record["sources"]["torch_algorithms"] == {"state": "off", "does": "nothing: CPU kernels are deterministic"}
    assert "K-chunks" in record["sources"]["splitk_gemm"]["does"]
    assert sources_on(determinism.describe(True, sources=resolve(True, on_gpu=False))) == []
    old_nondet = {"deterministic": False, "emulated_nondeterminism": ["embedding.word_embeddings.weight: ..."]}
    assert sources_on(old_nondet) == ["embedding_atomics"] and sources_on({"deterministic": True}) == []
    assert sources_on({}) is None


def test_a_users_loop_has_its_sources_read_off_its_knobs() -> None:
    from workbench.determinism import SourceState, fast_knobs, live_sources

    fast = fast_knobs({"NCCL_ALGO": "Ring", "CUBLAS_WORKSPACE_CONFIG": None, "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"},
                      deterministic_mode=False, torch_deterministic=True, fused_cross_entropy=False)
    assert fast == {"attention_backward": False, "splitk_gemm": True, "dp_allreduce": False,
                    "embedding_atomics": True, "torch_algorithms": False, "fused_cross_entropy": False}
    gpu = live_sources(fast, on_gpu=True)
    assert [n for n, s in gpu.items() if s is SourceState.ON] == ["embedding_atomics", "splitk_gemm"]
    cpu = live_sources(fast, on_gpu=False)  # nothing emulates them in a user's CPU loop
    assert cpu["splitk_gemm"] is SourceState.UNAVAILABLE and SourceState.ON not in cpu.values()

"""The determinism switches: the one place that says what deterministic mode sets.

Deterministic mode applies what Megatron's ``--deterministic-mode`` applies: the
``deterministic_mode`` flag of ``TransformerConfig`` (indexed embedding, no
nondeterministic TE attention), ``NCCL_ALGO=Ring``, ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``,
``CUBLAS_WORKSPACE_CONFIG=:4096:8``, ``torch.use_deterministic_algorithms(True)`` and no
fused cross-entropy. Nondeterministic mode leaves the fast defaults; on a CPU, whose
kernels are deterministic, the runner emulates GPU atomics (see
``workbench.runner.nondeterminism``) and the manifest says so.

The environment variables must be in place before CUDA and NCCL initialise, so the
launcher puts them in each rank's environment; ``apply_in_process`` does the rest inside
the rank. Importing this module does not import torch.
"""

from __future__ import annotations

import os
from typing import Any

DETERMINISTIC_ENV: dict[str, str] = {
    "NCCL_ALGO": "Ring",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
}
"""Environment of a deterministic rank (Megatron's deterministic mode and its CI)."""

NUMERICS_ENV_VARS: tuple[str, ...] = (
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_NVLS_ENABLE",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO", "NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN", "CUBLAS_WORKSPACE_CONFIG",
    "CUDA_DEVICE_MAX_CONNECTIONS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
)
"""Variables recorded in every manifest because they can change the numbers."""


def rank_environment(deterministic: bool, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for one rank: ``base`` plus (in deterministic mode) the switches.

    In nondeterministic mode the switches are removed when inherited, so that a
    "nondeterministic" run really runs with the defaults.
    """
    env = dict(os.environ if base is None else base)
    for key, value in DETERMINISTIC_ENV.items():
        if deterministic:
            env[key] = value
        else:
            env.pop(key, None)
    return env


def transformer_config_flags(deterministic: bool) -> dict[str, Any]:
    """Keyword arguments of Megatron's ``TransformerConfig`` that deterministic mode fixes."""
    flags: dict[str, Any] = {"deterministic_mode": deterministic}
    if deterministic:
        flags["cross_entropy_loss_fusion"] = False
    return flags


def apply_in_process(deterministic: bool) -> None:
    """Set the in-process switches (torch's deterministic algorithms) for this rank."""
    import torch

    torch.use_deterministic_algorithms(deterministic)


def describe(deterministic: bool, emulated_nondeterminism: list[str] | None = None) -> dict[str, Any]:
    """The manifest's record of every switch and of the environment that affects numerics."""
    return {
        "deterministic": deterministic,
        "transformer_config": transformer_config_flags(deterministic),
        "torch_use_deterministic_algorithms": deterministic,
        "required_env": dict(DETERMINISTIC_ENV) if deterministic else {},
        "env": {key: os.environ.get(key) for key in NUMERICS_ENV_VARS},
        "emulated_nondeterminism": list(emulated_nondeterminism or []),
    }

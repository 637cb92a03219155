"""The environment's fingerprint: the facts of a machine and a process that change the last bits of a
float result, recorded in a run's manifest (``runtime``), and the difference between two runs' facts.

    facts = collect(device="cpu", world_size=2)     # in the training process (imports torch lazily)
    difference(a.manifest.runtime, b.manifest.runtime).summary()
    # "the runs differ in: CPU vector ISA avx512 vs avx2; torch threads 2 vs 1"
    # "identical environments: the difference is in the code or the configuration"

Recorded on every machine: the CPU model and the vector instruction set torch's CPU kernels dispatch to
(``torch.backends.cpu.get_cpu_capability``: the width of a reduction's partial sums), torch's intra- and
inter-op threads, the torch, megatron-core, Transformer Engine and NCCL versions, the environment
variables that switch kernels or collectives (``DETERMINISM_VARIABLES``, those set), the world size and
ranks per host. On a GPU also the GPU model, the driver and CUDA versions, the topology as
``nvidia-smi topo -m`` prints it, and the container image where the container says (NVIDIA's set
``NVIDIA_PYTORCH_VERSION``). Collecting costs one ``nvidia-smi`` call on a GPU, nothing measurable on a CPU.

Where megatron-core ships Megatron-LM's ``megatron/training/determinism.py`` (0.19+), the facts also hold
whether the environment passes its ``--deterministic-mode`` checks (``NCCL_ALGO`` without ``Tree``,
``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``, a deterministic ``CUBLAS_WORKSPACE_CONFIG``, ``MAMBA_DETERMINISTIC``;
cross-entropy fusion and TP communication overlap off), each failing variable named
(``megatron_determinism``), run with Megatron's own code on a copy of the environment.

``difference`` is pure (no torch): any two mappings of these facts, from any producer; a fact one run
did not record is named as unknown, never as equal.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LABELS: dict[str, str] = {
    "cpu_isa": "CPU vector ISA",
    "cpu_model": "CPU model",
    "torch_threads": "torch threads",
    "torch_interop_threads": "torch inter-op threads",
    "world_size": "world size",
    "ranks_per_host": "ranks per host",
    "device": "device",
    "gpu_model": "GPU model",
    "driver": "GPU driver",
    "cuda": "CUDA",
    "nccl": "NCCL",
    "topology": "GPU topology",
    "container": "container image",
    "torch": "torch",
    "megatron_core": "megatron-core",
    "transformer_engine": "Transformer Engine",
    "backend": "process-group backend",
}
"""Every fact, by its key in ``runtime``, with the label a difference prints; in the order a difference is
told (the ones that change the last bits on the same code first)."""

BITWISE_FACTS = ("cpu_isa", "device", "gpu_model", "torch_threads", "world_size")
"""Facts across which bitwise equality is not to be expected even with deterministic kernels: a reduction
is split differently (vector width, threads, ranks) or runs on other hardware."""

DETERMINISM_VARIABLES = (
    "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG",
    "CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_ALGO", "NCCL_PROTO", "NCCL_NTHREADS", "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_NVLS_ENABLE", "NCCL_COLLNET_ENABLE",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO", "NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN", "NVTE_UNFUSED_ATTN",
    "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK", "PYTHONHASHSEED",
)
"""Environment variables that change which kernel or collective algorithm runs (recorded when set)."""

ENV_KEY = "env"
"""The key in ``runtime`` of the determinism variables that were set (name -> value)."""
MEGATRON_KEY = "megatron_determinism"
"""The key in ``runtime`` of the verdict of Megatron-LM's own determinism checks (``megatron_determinism``)."""
MEGATRON_LABEL = "Megatron-LM's determinism checks"

_PACKAGES = {"torch": "torch", "megatron_core": "megatron-core", "transformer_engine": "transformer-engine"}


def collect(*, device: str = "cpu", world_size: int | None = None, ranks_per_host: int | None = None,
            topology: bool = True, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The facts of this process and machine (see the module docstring). ``device``: ``cpu`` or
    ``cuda[:N]``; ``world_size`` and ``ranks_per_host`` default to ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``
    (one process: 1); ``topology``: ask ``nvidia-smi`` on a GPU; ``settings``: the run's options Megatron-LM's
    deterministic mode requires values of (``cross_entropy_loss_fusion``, ``tp_comm_overlap``: a
    ``TransformerConfig`` has both), where known."""
    import torch

    facts: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cpu_isa": str(torch.backends.cpu.get_cpu_capability()).lower(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "world_size": world_size or _int_env("WORLD_SIZE", 1),
        "ranks_per_host": ranks_per_host or _int_env("LOCAL_WORLD_SIZE", world_size or _int_env("WORLD_SIZE", 1)),
        **{key: _version(name) for key, name in _PACKAGES.items()},
        ENV_KEY: {name: os.environ[name] for name in DETERMINISM_VARIABLES if name in os.environ},
    }
    verdict = megatron_determinism(os.environ, settings)
    if verdict is not None:
        facts[MEGATRON_KEY] = verdict
    container = os.environ.get("NVIDIA_PYTORCH_VERSION") or os.environ.get("CONTAINER_IMAGE")
    if container:
        facts["container"] = container
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        facts["gpu_model"] = torch.cuda.get_device_name(index)
        facts["cuda"] = torch.version.cuda
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        facts.update(_nvidia_smi(topology))
    return facts


def megatron_determinism(env: Mapping[str, str], settings: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Whether ``env`` (and ``settings``) pass the checks of Megatron-LM's ``--deterministic-mode``
    (``megatron/training/determinism.py``, megatron-core 0.19+): ``{"passes": bool, "failing": [...]}``, each
    failing variable or option named with Megatron's own reason (``"NCCL_ALGO='Tree': each token must be in
    [...]"``). Megatron's checks assert and set defaults, so they run on a copy, one variable at a time (each
    failure is named, not only the first). None where the installed megatron-core has no such checks."""
    checks = _megatron_checks()
    if checks is None:
        return None
    failing = []
    accepted = getattr(checks, "ACCEPTED_ENV_VAR_VALUES", {})
    for name in ("NCCL_ALGO", *accepted, "MAMBA_DETERMINISTIC"):
        if name not in env:
            continue
        try:
            checks.apply_determinism_env({name: env[name]})
        except AssertionError as err:
            stated = f"{name}={env[name]!r}"
            reason = str(err).strip().removeprefix(stated).lstrip(": ").rstrip(".")
            failing.append(f"{stated}: {reason}")
    for name, required in getattr(checks, "ARG_VALUES_REQUIRED_FOR_DETERMINISM", {}).items():
        if settings is not None and name in settings and settings[name] != required:
            failing.append(f"{name}={settings[name]!r}: --deterministic-mode requires {required!r}")
    return {"passes": not failing, "failing": failing}


MEGATRON_SETTINGS = ("cross_entropy_loss_fusion", "tp_comm_overlap")
"""The options Megatron-LM's deterministic mode requires values of, as a ``TransformerConfig`` names them."""


def megatron_settings(config: Any) -> dict[str, Any]:
    """The ``MEGATRON_SETTINGS`` a model's config has (a ``TransformerConfig``; None: none)."""
    return {name: getattr(config, name) for name in MEGATRON_SETTINGS if hasattr(config, name)}


def megatron_verdict(facts: Mapping[str, Any]) -> str | None:
    """Megatron-LM's determinism checks in words, from a run's ``runtime``: ``"pass"``, ``"fail
    (NCCL_ALGO='Tree')"``; None where they were not run."""
    verdict = facts.get(MEGATRON_KEY)
    if not isinstance(verdict, Mapping):
        return None
    failing = [str(f).split(": ", 1)[0] for f in verdict.get("failing") or []]
    return "pass" if verdict.get("passes") and not failing else f"fail ({', '.join(failing) or '?'})"


@functools.cache
def _megatron_checks() -> Any:
    """Megatron-LM's ``determinism`` module, loaded from its file alone (importing ``megatron.training`` would
    import the whole training package), or None."""
    import importlib.util

    try:
        core = importlib.util.find_spec("megatron.core")
    except (ImportError, ValueError):
        return None
    if core is None or not core.origin:
        return None
    path = Path(core.origin).parent.parent / "training" / "determinism.py"
    spec = importlib.util.spec_from_file_location("_workbench_megatron_determinism", path)
    if not path.is_file() or spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # another release's file that does not load alone: not checked
        return None
    return module if callable(getattr(module, "apply_determinism_env", None)) else None


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else default


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvidia_smi(topology: bool) -> dict[str, Any]:
    """The driver's version and (with ``topology``) ``nvidia-smi topo -m``; nothing where it cannot run."""
    facts: dict[str, Any] = {}
    commands = {"driver": ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]}
    if topology:
        commands["topology"] = ["nvidia-smi", "topo", "-m"]
    for key, command in commands.items():
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        facts[key] = out.splitlines()[0].strip() if key == "driver" and out else out
    return facts


@dataclass(frozen=True)
class FactDifference:
    key: str
    label: str
    a: Any
    b: Any

    def text(self) -> str:
        if self.key == "topology":
            return f"{self.label} (nvidia-smi topo -m differs)"
        return f"{self.label} {_value(self.a)} vs {_value(self.b)}"


def _value(value: Any) -> str:
    return "unknown" if value is None else str(value)


@dataclass(frozen=True)
class EnvironmentDifference:
    """How two runs' environments differ (``difference``)."""

    differences: list[FactDifference]
    unknown: list[str]
    """Labels of the facts that one run recorded and the other did not (or neither, where one run recorded no
    facts at all: then every fact)."""

    @property
    def identical(self) -> bool:
        """Every fact both runs recorded agrees, and neither lacks one the other has."""
        return not self.differences and not self.unknown

    @property
    def bitwise_expected(self) -> bool:
        """Whether bitwise equality can be expected of deterministic runs of the same code here: False where a
        fact of ``BITWISE_FACTS`` differs."""
        return not any(d.key in BITWISE_FACTS for d in self.differences)

    def summary(self, *, bitwise_check: bool = False, runs_differ: bool = True) -> str:
        """One line; with ``bitwise_check`` (the check compared fingerprints) a second where bitwise equality was
        not to be expected. ``runs_differ``: whether the runs compared differ (an identical pair has no
        difference to place)."""
        if self.identical:
            return ("identical environments: the difference is in the code or the configuration" if runs_differ
                    else "identical environments")
        if not self.differences and self.unknown and self.unknown[0].startswith(("every fact", "both runs")):
            who = "neither run says" if self.unknown[0] == "both runs' facts" else \
                f"the {self.unknown[0].split()[-2]} run does not say"
            return f"environments not compared: {who} where it ran (an import, or an older store)"
        parts = [d.text() for d in self.differences]
        line = f"the runs differ in: {'; '.join(parts)}" if parts else "no recorded fact of the environment differs"
        if self.unknown:
            line += f" (not recorded by both: {', '.join(self.unknown)})"
        if bitwise_check and not self.bitwise_expected:
            split = ", ".join(d.label for d in self.differences if d.key in BITWISE_FACTS)
            line += (f"\n  bitwise equality was not to be expected across a different {split}: check within a "
                     "tolerance with --rtol")
        return line

    def to_dict(self) -> dict[str, Any]:
        return {"identical": self.identical, "bitwise_expected": self.bitwise_expected,
                "differences": [{"fact": d.key, "label": d.label, "a": d.a, "b": d.b} for d in self.differences],
                "unknown": list(self.unknown)}


def difference(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> EnvironmentDifference:
    """The facts in which ``a`` and ``b`` (two runs' ``runtime``) differ, in ``LABELS``' order, each set
    determinism variable as one fact of its own."""
    a, b = dict(a or {}), dict(b or {})
    if not a or not b:  # a run that recorded no facts: nothing is known to agree
        return EnvironmentDifference([], [f"every fact of the {'first' if not a else 'second'} run"] if a or b
                                     else ["both runs' facts"])
    found: list[FactDifference] = []
    unknown: list[str] = []
    for key, label in LABELS.items():
        if key not in a and key not in b:
            continue
        if (key in a) != (key in b):
            unknown.append(label)
        elif a[key] != b[key]:
            found.append(FactDifference(key, label, a[key], b[key]))
    verdicts = megatron_verdict(a), megatron_verdict(b)
    if (verdicts[0] is None) != (verdicts[1] is None):
        unknown.append(MEGATRON_LABEL)
    elif verdicts[0] != verdicts[1]:
        found.append(FactDifference(MEGATRON_KEY, MEGATRON_LABEL, *verdicts))
    env_a, env_b = a.get(ENV_KEY), b.get(ENV_KEY)
    if isinstance(env_a, Mapping) and isinstance(env_b, Mapping):
        for name in sorted(set(env_a) | set(env_b)):
            if env_a.get(name) != env_b.get(name):
                found.append(FactDifference(name, name, env_a.get(name), env_b.get(name)))
    elif (env_a is None) != (env_b is None):
        unknown.append("determinism variables")
    return EnvironmentDifference(found, unknown)

"""CPU compatibility layer for megatron-core's CUDA-only call sites.

megatron-core 0.16.1 allocates buffers with ``device=torch.cuda.current_device()`` or a
literal ``device="cuda"``, synchronises with ``torch.cuda.synchronize`` and keeps its
model-parallel RNG state in the CUDA generator. On a machine without a GPU this module
maps each of those to the CPU, so the real Megatron Core code paths (schedules, DDP grad
buffers, p2p, tensor-parallel layers) run unchanged on gloo.

It is installed only when no GPU is present (``install_if_needed``), once per process,
and never touches a process that has CUDA.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")
_installed: _CudaToCpuMode | None = None


def _is_cuda(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return False


def _as_cuda_type_name(name: str) -> str:
    """``torch.FloatTensor`` as ``torch.cuda.FloatTensor``: the name a tensor's ``type()`` gives on a GPU."""
    return name.replace("torch.", "torch.cuda.", 1) if name.startswith("torch.") and ".cuda." not in name else name


class _CudaToCpuMode(TorchFunctionMode):
    """Rewrites CUDA device arguments of every torch call to the CPU.

    Megatron's schedules and optimizer spell ``device="cuda"`` literally; a function
    mode is the one place that sees those calls without patching Megatron's source.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs = {**kwargs, "device": _CPU}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return _as_cuda_type_name(func(*args))
        if func is torch.Tensor.to and args[1:] and _is_cuda(args[1]):
            args = (args[0], _CPU, *args[2:])
        return func(*args, **kwargs)


def _cpu_rng_state(*_args: Any, **_kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _set_cpu_rng_state(state: torch.Tensor, *_args: Any, **_kwargs: Any) -> None:
    torch.set_rng_state(state)


def _cpu_manual_seed(seed: int) -> None:
    # torch.manual_seed itself calls torch.cuda.manual_seed_all: seed the generator directly.
    torch.default_generator.manual_seed(seed)


class _CpuStream:
    """What ``torch.cuda.current_stream()`` answers on the CPU: work is done in program order, so waiting
    on an event or a stream is nothing to do (megatron-core 0.19 ``param_and_grad_buffer.start_grad_sync``
    waits on CUDA-graph events through it)."""

    device = _CPU

    def wait_event(self, event: object) -> None:
        pass

    def wait_stream(self, stream: object) -> None:
        pass

    def synchronize(self) -> None:
        pass


def install() -> None:
    """Map megatron-core's CUDA-only call sites to the CPU in this process (idempotent)."""
    global _installed
    if _installed is not None:
        return
    if torch.cuda.is_available():
        raise RuntimeError("the CPU compatibility layer must not be installed where CUDA works")
    torch.cuda.current_device = lambda: _CPU  # type: ignore[assignment, return-value]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.current_stream = lambda *a, **k: _CpuStream()  # type: ignore[assignment, return-value]
    torch.cuda.get_rng_state = _cpu_rng_state  # type: ignore[assignment]
    torch.cuda.set_rng_state = _set_cpu_rng_state  # type: ignore[assignment]
    torch.cuda.manual_seed = _cpu_manual_seed  # type: ignore[assignment]

    from workbench.recorder.kernels import quiet_cpp_extension

    quiet_cpp_extension()  # Megatron imports it next, which would say "No CUDA runtime is found" on this machine
    from megatron.core.tensor_parallel import random as mcore_random

    mcore_random._get_cuda_rng_state = _cpu_rng_state
    mcore_random._set_cuda_rng_state = _set_cpu_rng_state

    # moe_utils imports te_general_gemm inside a try that fails without Transformer Engine and
    # then reads the name anyway (RouterGatingLinearFunction): None is its "not available".
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None

    _hybrid_final_norm()

    _installed = _CudaToCpuMode()
    _installed.__enter__()


def _hybrid_final_norm() -> None:
    """HybridStack (megatron-core 0.18+) builds its final norm with ``TENorm`` whatever its spec says, which
    raises without Transformer Engine: it gets Megatron's torch norm, the local GPT spec's norm here."""
    try:
        from megatron.core.models.hybrid import hybrid_block
    except ImportError:  # 0.16 and 0.17 have no HybridStack
        return
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    hybrid_block.TENorm = WrappedTorchNorm  # type: ignore[misc, assignment]


def install_if_needed() -> bool:
    """Install the layer when this process has no GPU; return whether it is active."""
    if torch.cuda.is_available():
        return False
    install()
    return True


def is_installed() -> bool:
    return _installed is not None

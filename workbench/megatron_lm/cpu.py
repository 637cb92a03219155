"""What Megatron-LM's ``pretrain()`` (megatron-core 0.17-0.19) needs to train on a machine without a GPU,
applied from outside Megatron (its source is never edited), on top of the runner's ``cpu_compat`` layer.

Each patch routes around one call site (line numbers of megatron-core 0.19.2; 0.17.1 and 0.18.2 have the same
sites, and their ``_initialize_distributed`` has no ``skip_model_parallel_init``):

* ``training/initialize.py:66`` asserts "Megatron requires CUDA" unless ``allow_no_cuda=True``, which
  ``pretrain()`` never passes: the name ``pretrain()`` looks up gets the flag.
* ``initialize.py:358`` skips ``mpu.initialize_model_parallel`` when ``torch.cuda.device_count()`` is 0 (it
  fails later: "pipeline_model parallel group is not initialized"): it is called after, with the same
  arguments.
* ``initialize.py:447`` skips ``model_parallel_cuda_manual_seed`` for the same reason (the first forward then
  fails: "cuda rng state model-parallel-rng is not added"): called after, as Megatron would.
* ``training.py:1876-1896`` (``get_model``) wraps DDP in a ``torch.cuda.Stream``: a CPU stand-in.
* ``arguments.py:1414`` (TP > 1) asks the GPU's architecture: answered as pre-Blackwell, so Megatron asks
  for ``CUDA_DEVICE_MAX_CONNECTIONS=1``, which is set where unset.
* ``training.py:1117`` warms up fused kernels with ``torch.compile`` on CUDA tensors: skipped (on the CPU it
  compiles C++ for ~15 s of start-up and changes nothing of the training).

Megatron's optimizer checks CUDA tensor type names (clipping, ``--bf16``/``--fp16``, the distributed optimizer):
``cpu_compat`` answers them, so ``--clip-grad``, ``--use-distributed-optimizer``, ``--overlap-grad-reduce`` and
``--overlap-param-gather`` train on the CPU too.
"""

from __future__ import annotations

import functools
import inspect
import os
from contextlib import nullcontext
from typing import Any

import torch

from workbench.runner import cpu_compat


def install() -> None:
    """Apply every patch of the module docstring (once; call before the entry script imports Megatron-LM's
    training)."""
    cpu_compat.install()
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    torch.cuda.Stream = type("Stream", (cpu_compat._CpuStream,), {"__init__": lambda self, *a, **k: None})  # type: ignore[assignment, misc]
    torch.cuda.stream = lambda *a, **k: nullcontext()  # type: ignore[assignment]

    import megatron.training.arguments as arguments
    import megatron.training.initialize as initialize
    import megatron.training.training as training

    arguments.get_device_arch_version = lambda: 0
    training.initialize_megatron = functools.partial(initialize.initialize_megatron, allow_no_cuda=True)
    training.set_jit_fusion_options = lambda *a, **k: None
    initialize._initialize_distributed = _with_model_parallel(initialize._initialize_distributed)
    initialize._set_random_seed = _with_model_parallel_seed(initialize._set_random_seed)


def _with_model_parallel(initialize_distributed: Any) -> Any:
    skips = "skip_model_parallel_init" in inspect.signature(initialize_distributed).parameters  # 0.19+

    def call(*args: Any, skip_model_parallel_init: bool = False, **kwargs: Any) -> Any:
        from megatron.core import mpu
        from megatron.training import get_args

        if skips:
            kwargs["skip_model_parallel_init"] = skip_model_parallel_init
        result = initialize_distributed(*args, **kwargs)
        if not skip_model_parallel_init and not mpu.model_parallel_is_initialized():
            a = get_args()
            embedding_ranks, position_ranks = (list(args) + [None, None])[:2]
            mpu.initialize_model_parallel(
                a.tensor_model_parallel_size, a.pipeline_model_parallel_size,
                a.virtual_pipeline_model_parallel_size, context_parallel_size=a.context_parallel_size,
                expert_model_parallel_size=a.expert_model_parallel_size,
                distributed_timeout_minutes=a.distributed_timeout_minutes,
                order="tp-cp-ep-pp-dp" if getattr(a, "use_tp_pp_dp_mapping", False) else "tp-cp-ep-dp-pp",
                get_embedding_ranks=embedding_ranks, get_position_embedding_ranks=position_ranks,
                create_gloo_process_groups=getattr(a, "use_gloo_process_groups", True))
        return result

    return call


def _with_model_parallel_seed(set_random_seed: Any) -> Any:
    signature = inspect.signature(set_random_seed)

    def call(*args: Any, **kwargs: Any) -> Any:
        from megatron.core import mpu, tensor_parallel

        result = set_random_seed(*args, **kwargs)
        if torch.cuda.device_count() == 0:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            given = bound.arguments
            seed = int(next(iter(given.values()))) + 100 * mpu.get_pipeline_model_parallel_rank()
            if given.get("data_parallel_random_init"):
                seed += 10 * mpu.get_data_parallel_rank()
            tensor_parallel.model_parallel_cuda_manual_seed(
                seed, te_rng_tracker=bool(given.get("te_rng_tracker")),
                inference_rng_tracker=bool(given.get("inference_rng_tracker")),
                use_cudagraphable_rng=bool(given.get("use_cudagraphable_rng")))
        return result

    return call

"""Building the Megatron Core GPT model for one rank, initialised the same for every layout.

The model is Megatron Core's ``GPTModel`` with the local layer spec (or the Transformer
Engine spec for fp8), wrapped in ``Float16Module`` for bf16/fp16 and in Megatron's
``DistributedDataParallel`` for its grad buffers. Megatron's own initialisation draws
from an RNG stream whose position depends on which layers a pipeline stage builds, so
its values are replaced: every parameter is drawn in full from a generator seeded by
``(seed, canonical name)`` and this rank keeps its tensor-parallel shard. A TP=2, PP=2 or
DP=2 run therefore starts bitwise identical to the TP=1 PP=1 DP=1 run.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
from megatron.core import parallel_state as ps
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.transformer_config import TransformerConfig

from workbench import determinism
from workbench.config import Precision, RunConfig
from workbench.errors import UnsupportedError
from workbench.sites import canonical_name


@dataclass
class BuiltModel:
    ddp: DistributedDataParallel
    """The model chunk handed to the schedules and the optimizer."""
    gpt: GPTModel
    """The unwrapped model (for hooks and names)."""
    config: TransformerConfig
    global_layer: dict[int, int]
    """Local layer index on this stage -> global layer number (0-based)."""

    def named_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """(canonical name, parameter) for every parameter this rank holds, in model order."""
        return [(canonical_name(n, self.global_layer), p) for n, p in self.gpt.named_parameters()]


def compute_dtype(precision: Precision) -> torch.dtype:
    return {Precision.FP32: torch.float32, Precision.BF16: torch.bfloat16,
            Precision.FP16: torch.float16, Precision.FP8: torch.bfloat16}[precision]


def check_precision_supported(precision: Precision, on_gpu: bool) -> None:
    """fp8 needs a Hopper-class GPU and Transformer Engine; fail with a sentence, not a crash."""
    if precision is not Precision.FP8:
        return
    if not on_gpu:
        raise UnsupportedError("precision 'fp8' needs an NVIDIA GPU with compute capability >= 8.9 and "
                               "Transformer Engine; this machine has no GPU (use fp32, bf16 or fp16)")
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        raise UnsupportedError(f"precision 'fp8' needs compute capability >= 8.9; this GPU has {major}.{minor}")
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        raise UnsupportedError("precision 'fp8' needs Transformer Engine (pip install transformer-engine)") from None


def transformer_config(cfg: RunConfig, on_gpu: bool) -> TransformerConfig:
    m, dtype = cfg.model, compute_dtype(cfg.precision)
    cpu_flags = {} if on_gpu else {
        "use_cpu_initialization": True, "gradient_accumulation_fusion": False,
        "bias_activation_fusion": False, "masked_softmax_fusion": False, "persist_layer_norm": False,
        "bias_dropout_fusion": False, "apply_rope_fusion": False,
    }
    fp8_flags = {"fp8": "hybrid"} if cfg.precision is Precision.FP8 else {}
    return TransformerConfig(
        num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
        ffn_hidden_size=m.ffn_size, init_method_std=m.init_std,
        tensor_model_parallel_size=cfg.layout.tp, pipeline_model_parallel_size=cfg.layout.pp,
        params_dtype=torch.float32, pipeline_dtype=dtype,
        bf16=cfg.precision in (Precision.BF16, Precision.FP8), fp16=cfg.precision is Precision.FP16,
        hidden_dropout=0.0, attention_dropout=0.0,
        # Megatron initialises (and only then marks tensor-parallel attributes on the weights);
        # initialize_parameters then overwrites every value layout-independently.
        perform_initialization=True,
        **cpu_flags, **fp8_flags,
        **determinism.transformer_config_flags(cfg.deterministic, cfg.source_states(on_gpu=on_gpu)),
    )


def layer_spec(cfg: RunConfig):  # type: ignore[no-untyped-def]
    if cfg.precision is Precision.FP8:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec()
    return get_gpt_layer_local_spec()


def build_model(cfg: RunConfig, device: torch.device) -> BuiltModel:
    on_gpu = device.type == "cuda"
    check_precision_supported(cfg.precision, on_gpu)
    tconfig = transformer_config(cfg, on_gpu)
    gpt = GPTModel(
        config=tconfig, transformer_layer_spec=layer_spec(cfg), vocab_size=cfg.model.vocab_size,
        max_sequence_length=cfg.model.seq_length, pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(), share_embeddings_and_output_weights=False,
        position_embedding_type=cfg.model.position_embedding.value,
    )
    if on_gpu:
        gpt.cuda(device)
    global_layer = {i: layer.layer_number - 1 for i, layer in enumerate(gpt.decoder.layers)}
    initialize_parameters(gpt, cfg, global_layer)
    module: torch.nn.Module = gpt
    if cfg.precision is not Precision.FP32:
        module = Float16Module(tconfig, gpt)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=False)
    ddp = DistributedDataParallel(config=tconfig, ddp_config=ddp_config, module=module)
    tconfig.finalize_model_grads_func = finalize_model_grads
    return BuiltModel(ddp=ddp, gpt=gpt, config=tconfig, global_layer=global_layer)


def parameter_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def full_shape(param: torch.Tensor, tp_size: int) -> list[int]:
    shape = list(param.shape)
    if getattr(param, "tensor_model_parallel", False):
        shape[param.partition_dim] *= tp_size  # type: ignore[attr-defined]
    return shape


def initial_value(name: str, shape: list[int], *, seed: int, std: float, num_layers: int) -> torch.Tensor:
    """The full (unsharded) fp32 initial value of the parameter called ``name``."""
    leaf = name.rsplit(".", 2)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    if "norm" in leaf[-2] or "layer_norm" in leaf[-1]:
        return torch.ones(shape)
    if not name.endswith("weight"):
        raise ValueError(f"no initialisation rule for parameter {name!r}")
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        std = std / math.sqrt(2.0 * num_layers)  # Megatron's scaled init for residual outputs
    generator = torch.Generator().manual_seed(parameter_seed(seed, name))
    return torch.empty(shape).normal_(0.0, std, generator=generator)


@torch.no_grad()
def initialize_parameters(gpt: torch.nn.Module, cfg: RunConfig, global_layer: dict[int, int]) -> None:
    tp_size, tp_rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    for local_name, param in gpt.named_parameters():
        name = canonical_name(local_name, global_layer)
        full = initial_value(name, full_shape(param, tp_size), seed=cfg.seed, std=cfg.model.init_std,
                             num_layers=cfg.model.num_layers)
        if getattr(param, "tensor_model_parallel", False):
            assert getattr(param, "partition_stride", 1) == 1, f"{name}: strided partitions are not supported"
            full = full.chunk(tp_size, dim=param.partition_dim)[tp_rank]  # type: ignore[attr-defined]
        param.copy_(full)

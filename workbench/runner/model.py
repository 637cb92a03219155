"""Building the Megatron Core GPT model for one rank, initialised the same for every layout.

The model is Megatron Core's ``GPTModel`` with the local layer spec (or the Transformer
Engine spec for fp8), wrapped in ``Float16Module`` for bf16/fp16 and in Megatron's
``DistributedDataParallel`` for its grad buffers. Megatron's own initialisation draws
from an RNG stream whose position depends on which layers a pipeline stage builds, so
its values are replaced: every parameter is drawn in full from a generator seeded by
``(seed, canonical name)`` and this rank keeps its tensor-parallel shard. A TP=2, PP=2 or
DP=2 run therefore starts bitwise identical to the TP=1 PP=1 DP=1 run; so does an EP=2 run,
whose experts are named (and so drawn) by their global index.

A MoE model (``model.num_experts``) uses Megatron's ``MoELayer`` from the local spec: the
top-k router with the load-balancing aux loss, the ``allgather`` token dispatcher (the
``alltoall`` one builds a ``torch.cuda.Stream``), ``SequentialMLP`` experts (grouped GEMMs
need Transformer Engine or grouped_gemm), experts not split over TP (expert TP size 1) and
no linear biases (Megatron refuses expert biases in some TP/EP combinations).

Sequence parallelism uses the local spec with ``SequenceParallelNorm`` for its norms; a
virtual pipeline builds one GPTModel (and DDP) per virtual stage, Megatron's model chunks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from typing import Any

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
from workbench.recorder.targets import ParallelRanks, first_expert
from workbench.sites import canonical_name


@dataclass
class BuiltModel:
    chunks: list[DistributedDataParallel]
    """The model chunks handed to the schedules and the optimizer: one, or one per virtual pipeline stage."""
    gpts: list[GPTModel]
    """The unwrapped chunks (for hooks and names)."""
    config: TransformerConfig
    global_layers: list[dict[int, int]]
    """Per chunk: local layer index -> global layer number (0-based)."""
    first_expert: int = 0
    """Global index of this rank's first local expert (0 without experts)."""

    @property
    def ddp(self) -> DistributedDataParallel:
        """The model chunk of a run without virtual pipeline stages."""
        return self._one(self.chunks)

    @property
    def gpt(self) -> GPTModel:
        """The unwrapped model of a run without virtual pipeline stages."""
        return self._one(self.gpts)

    @staticmethod
    def _one(items: list[Any]) -> Any:
        if len(items) != 1:
            raise ValueError(f"the model has {len(items)} chunks (virtual pipeline stages): use chunks / gpts")
        return items[0]

    def named_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """(canonical name, parameter) for every parameter this rank holds, in model order."""
        return [(canonical_name(n, layers, self.first_expert), p) for gpt, layers in zip(self.gpts, self.global_layers)
                for n, p in gpt.named_parameters()]

    def named_modules(self) -> list[tuple[str, torch.nn.Module]]:
        """(canonical name, module) for every named module of every chunk."""
        return [(canonical_name(n, layers, self.first_expert), m) for gpt, layers in zip(self.gpts, self.global_layers)
                for n, m in gpt.named_modules() if n]

    def modules(self) -> list[torch.nn.Module]:
        return [m for gpt in self.gpts for m in gpt.modules()]


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
    if m.is_moe and cfg.precision is Precision.FP8:
        raise UnsupportedError("a MoE model in fp8 is not supported by the runner (use fp32, bf16 or fp16)")
    cpu_flags = {} if on_gpu else {
        "use_cpu_initialization": True, "gradient_accumulation_fusion": False,
        "bias_activation_fusion": False, "masked_softmax_fusion": False, "persist_layer_norm": False,
        "bias_dropout_fusion": False, "apply_rope_fusion": False,
        # gloo pairs a rank's sends to one peer in the order they are posted; the batched p2p
        # posts a 2-rank ring's forward activation and backward gradient in opposite orders on
        # the two ranks (interleaved schedule), so each would receive the other. Megatron's
        # unbatched even/odd ordering pairs them correctly.
        "batch_p2p_comm": False,
    }
    fp8_flags = {"fp8": "hybrid"} if cfg.precision is Precision.FP8 else {}
    moe_flags = {} if not m.is_moe else {
        "num_moe_experts": m.num_experts, "moe_router_topk": m.moe_topk, "moe_aux_loss_coeff": m.moe_aux_loss_coeff,
        "moe_router_load_balancing_type": "aux_loss" if m.moe_aux_loss_coeff > 0 else "none",
        "moe_token_dispatcher_type": "allgather", "moe_grouped_gemm": False,
        "expert_model_parallel_size": cfg.layout.ep, "expert_tensor_parallel_size": 1, "add_bias_linear": False,
    }
    return TransformerConfig(
        num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
        ffn_hidden_size=m.ffn_size, init_method_std=m.init_std,
        tensor_model_parallel_size=cfg.layout.tp, pipeline_model_parallel_size=cfg.layout.pp,
        virtual_pipeline_model_parallel_size=cfg.layout.vp if cfg.layout.vp > 1 else None,
        sequence_parallel=cfg.layout.sp,
        params_dtype=torch.float32, pipeline_dtype=dtype,
        bf16=cfg.precision in (Precision.BF16, Precision.FP8), fp16=cfg.precision is Precision.FP16,
        hidden_dropout=0.0, attention_dropout=0.0,
        # Megatron initialises (and only then marks tensor-parallel attributes on the weights);
        # initialize_parameters then overwrites every value layout-independently.
        perform_initialization=True,
        **cpu_flags, **fp8_flags, **moe_flags,
        **determinism.transformer_config_flags(cfg.deterministic, cfg.source_states(on_gpu=on_gpu)),
    )


class SequenceParallelNorm:
    """Megatron's torch norm (``WrappedTorchNorm``) without its refusal of sequence parallelism.

    With sequence parallelism each TP rank normalises its share of the sequence, so a norm's
    weight gradient is a partial sum: marking the parameters ``sequence_parallel`` makes
    Megatron's ``finalize_model_grads`` all-reduce them over the TP group, as it does for the
    Transformer Engine and Apex norms.
    """

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5,  # type: ignore[misc]
                **_unused: Any) -> torch.nn.Module:
        norms = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}
        if config.normalization not in norms:
            raise UnsupportedError(f"normalization {config.normalization!r} with sequence parallelism")
        norm = norms[config.normalization](hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]
        return norm


def layer_spec(cfg: RunConfig, tconfig: TransformerConfig, vp_stage: int | None = None):  # type: ignore[no-untyped-def]
    """The layer spec (or, with sequence parallelism, the block spec with its final norm) of this stage."""
    experts = cfg.model.num_experts or None
    if cfg.precision is Precision.FP8:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec(num_experts=experts, moe_grouped_gemm=False)
    spec = get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False)
    if not cfg.layout.sp:
        return spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    spec = dataclasses.replace(spec, submodules=dataclasses.replace(
        spec.submodules, input_layernorm=SequenceParallelNorm, pre_mlp_layernorm=SequenceParallelNorm))
    return TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(tconfig, vp_stage=vp_stage),
                                      layer_norm=SequenceParallelNorm)


def build_model(cfg: RunConfig, device: torch.device) -> BuiltModel:
    on_gpu = device.type == "cuda"
    check_precision_supported(cfg.precision, on_gpu)
    tconfig = transformer_config(cfg, on_gpu)
    vp = cfg.layout.vp
    o = cfg.optim
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=o.overlap_grad_reduce,
                                               use_distributed_optimizer=o.use_distributed_optimizer,
                                               overlap_param_gather=o.overlap_param_gather)
    chunks: list[DistributedDataParallel] = []
    gpts: list[GPTModel] = []
    layers: list[dict[int, int]] = []
    for stage in range(vp) if vp > 1 else [None]:  # Megatron's model chunks: one per virtual stage
        gpt = GPTModel(
            config=tconfig, transformer_layer_spec=layer_spec(cfg, tconfig, stage), vocab_size=cfg.model.vocab_size,
            max_sequence_length=cfg.model.seq_length,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            share_embeddings_and_output_weights=False, position_embedding_type=cfg.model.position_embedding.value,
            **({} if stage is None else {"vp_stage": stage}),
        )
        if on_gpu:
            gpt.cuda(device)
        global_layer = {i: layer.layer_number - 1 for i, layer in enumerate(gpt.decoder.layers)}
        first = first_expert(gpt)
        initialize_parameters(gpt, cfg, global_layer, first)
        module: torch.nn.Module = gpt
        if cfg.precision is not Precision.FP32:
            module = Float16Module(tconfig, gpt)
        # As Megatron's training loop: only the first chunk's grad buffer is split into buckets.
        chunks.append(DistributedDataParallel(config=tconfig, ddp_config=ddp_config, module=module,
                                              disable_bucketing=len(chunks) > 0))
        gpts.append(gpt)
        layers.append(global_layer)
    tconfig.finalize_model_grads_func = finalize_model_grads
    _overlap(tconfig, chunks, o.overlap_grad_reduce)
    return BuiltModel(chunks=chunks, gpts=gpts, config=tconfig, global_layers=layers, first_expert=first)


def _overlap(tconfig: TransformerConfig, chunks: list[DistributedDataParallel], grads: bool) -> None:
    """What Megatron-LM's training loop sets under ``overlap_grad_reduce``: the schedule holds each bucket's
    reduction back until the last micro-batch (``no_sync``) and starts a chunk's reductions as its backward
    ends (``grad_sync_func``); one chunk takes the function, several a list. Under ``overlap_param_gather``
    Megatron DDP's forward pre-hooks gather each bucket's updated parameters (its default, unaligned)."""
    if grads:
        no_sync, grad_sync = [chunk.no_sync for chunk in chunks], [chunk.start_grad_sync for chunk in chunks]
        tconfig.no_sync_func = no_sync[0] if len(chunks) == 1 else no_sync
        tconfig.grad_sync_func = grad_sync[0] if len(chunks) == 1 else grad_sync


def parameter_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def full_shape(param: torch.Tensor, tp_size: int) -> list[int]:
    shape = list(param.shape)
    if getattr(param, "tensor_model_parallel", False) and tp_size > 1:
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
def initialize_parameters(gpt: torch.nn.Module, cfg: RunConfig, global_layer: dict[int, int],
                          first: int = 0) -> None:
    ranks = ParallelRanks.current()
    for local_name, param in gpt.named_parameters():
        tp_rank, tp_size = ranks.tensor_parallel(param)  # experts: the expert-TP group (size 1 in this runner)
        name = canonical_name(local_name, global_layer, first)
        full = initial_value(name, full_shape(param, tp_size), seed=cfg.seed, std=cfg.model.init_std,
                             num_layers=cfg.model.num_layers)
        if getattr(param, "tensor_model_parallel", False) and tp_size > 1:
            assert getattr(param, "partition_stride", 1) == 1, f"{name}: strided partitions are not supported"
            full = full.chunk(tp_size, dim=param.partition_dim)[tp_rank]  # type: ignore[attr-defined]
        param.copy_(full)

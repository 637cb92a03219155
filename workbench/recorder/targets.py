"""What the recorder looks at in a Megatron Core model: parameters, modules, optimizer moments.

Everything here maps a rank's local objects to canonical, layout-independent names
(``workbench.sites``) and to their ``Placement`` in the full tensor.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from workbench.recorder.placement import Box, Placement, box_placement, flat_boxes, parameter_placement
from workbench.sites import canonical_name, hybrid_name

ACTIVATION_MODULES = re.compile(
    r"^(embedding|layers\.\d+|layers\.\d+\.(self_attention|mlp|input_layernorm|pre_mlp_layernorm"
    r"|attention_residual)|final_layernorm|output_layer)$")
"""Modules whose outputs (and output gradients) are recorded: the embedding, every transformer
layer with its attention block, MLP and norms, the final norm and the output layer (a HybridModel's
layers by ``workbench.sites.hybrid_name``). A MoE layer's router and experts have sites of their
own (``workbench.recorder.moe``)."""


@dataclass(frozen=True)
class ParallelRanks:
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    dp_rank: int = 0
    dp_size: int = 1
    expert_tp_rank: int = 0
    expert_tp_size: int = 1
    expert_dp_rank: int = 0
    """Rank among the replicas of this rank's experts (Megatron's expert-data-parallel group)."""

    def tensor_parallel(self, param: torch.Tensor) -> tuple[int, int]:
        """(rank, size) in the group that splits ``param``: the expert-tensor-parallel group for an expert's
        parameter, the tensor-parallel group for any other."""
        if is_expert_parameter(param):
            return self.expert_tp_rank, self.expert_tp_size
        return self.tp_rank, self.tp_size

    @classmethod
    def current(cls) -> ParallelRanks:
        from megatron.core import parallel_state as ps

        if not ps.model_parallel_is_initialized():
            return cls()
        return cls(tp_rank=ps.get_tensor_model_parallel_rank(), tp_size=ps.get_tensor_model_parallel_world_size(),
                    pp_rank=ps.get_pipeline_model_parallel_rank(), dp_rank=ps.get_data_parallel_rank(),
                    dp_size=ps.get_data_parallel_world_size(),
                    expert_tp_rank=ps.get_expert_tensor_parallel_rank(),
                    expert_tp_size=ps.get_expert_tensor_parallel_world_size(),
                    expert_dp_rank=ps.get_expert_data_parallel_rank())


def all_gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (collective; ``[obj]`` without a process group)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def unwrap(chunk: torch.nn.Module) -> torch.nn.Module:
    """The model inside Megatron's DDP / ``Float16Module`` wrappers."""
    while hasattr(chunk, "module") and isinstance(chunk.module, torch.nn.Module):
        chunk = chunk.module
    return chunk


def global_layers(model: torch.nn.Module) -> dict[int, int]:
    """Local layer index -> global (0-based) layer number, from Megatron's ``layer_number``."""
    decoder = getattr(model, "decoder", None)
    layers = getattr(decoder, "layers", [])
    return {i: int(layer.layer_number) - 1 for i, layer in enumerate(layers)}


def hybrid_pattern(model: torch.nn.Module) -> str | None:
    """A HybridModel's ``hybrid_layer_pattern`` (megatron-core 0.18+), None for any other model."""
    pattern = getattr(model, "hybrid_layer_pattern", None)
    return pattern if isinstance(pattern, str) else None


def site_names(model: torch.nn.Module) -> Callable[[str], str]:
    """The canonical name of each of ``model``'s parameters and modules, by its local name
    (``workbench.sites``; a HybridModel's by ``hybrid_name``)."""
    layers, first, pattern = global_layers(model), first_expert(model), hybrid_pattern(model)
    if pattern is None:
        return lambda local_name: canonical_name(local_name, layers, first)
    return lambda local_name: hybrid_name(canonical_name(local_name, layers, first), pattern)


def first_expert(model: torch.nn.Module) -> int:
    """The global index of this rank's first local expert (Megatron's ``MoELayer.local_expert_indices``), 0 when
    the model has no experts. Every MoE layer of a rank holds the same expert indices."""
    for module in model.modules():
        indices = getattr(module, "local_expert_indices", None)
        if indices:
            return int(indices[0])
    return 0


def is_expert_parameter(param: torch.Tensor) -> bool:
    """True for a parameter of an expert: Megatron marks them ``allreduce = False`` (their gradients are reduced
    over the expert-data-parallel group, not the data-parallel one)."""
    return not getattr(param, "allreduce", True)


@dataclass(frozen=True)
class ParameterTarget:
    name: str
    param: torch.nn.Parameter
    placement: Placement
    box: Box | None = None
    """The block of the parameter this target is (a distributed optimizer's shard is one to three), None for all."""
    shard: tuple[int, int] | None = None
    """The block's elements in the flat shard this rank owns (its optimizer state's indices)."""

    def view(self, tensor: torch.Tensor) -> torch.Tensor:
        """This target's block of ``tensor`` (the parameter, its gradient, or state of the parameter's shape)."""
        return tensor if self.box is None else tensor[self.box]

    def of_shard(self, flat: torch.Tensor) -> torch.Tensor:
        """This target's block of ``flat``, a tensor of the owned shard's elements (a distributed optimizer's state)."""
        if self.shard is None or self.box is None:
            return flat.view(self.param.shape)
        return flat.view(-1)[self.shard[0]:self.shard[1]].view([part.stop - part.start for part in self.box])


def parameter_targets(chunks: list[torch.nn.Module], ranks: ParallelRanks) -> list[ParameterTarget]:
    targets = []
    for chunk in chunks:
        model = unwrap(chunk)
        name = site_names(model)
        for local_name, param in model.named_parameters():
            tp_rank, tp_size = ranks.tensor_parallel(param)
            dp_rank = ranks.expert_dp_rank if is_expert_parameter(param) else ranks.dp_rank
            placement = parameter_placement(param, tp_rank=tp_rank, tp_size=tp_size, dp_rank=dp_rank)
            targets.append(ParameterTarget(name(local_name), param, placement))
    return targets


def distributed_optimizers(optimizer: Any) -> list[Any]:
    """The parts of ``optimizer`` that are Megatron's distributed optimizer (each keeps the shard of each
    parameter that this data-parallel rank owns)."""
    if optimizer is None:
        return []
    return [part for part in optimizers(optimizer) if hasattr(part, "_get_model_param_range_map")
            and hasattr(part, "model_param_gbuf_map")]


def owned_targets(targets: list[ParameterTarget], ranks: ParallelRanks, optimizer: Any, *,
                  split_replicas: bool = True) -> list[ParameterTarget]:
    """The targets whose values this rank reads for ``param``, ``grad``, the moments and ``update``.

    Under Megatron's distributed optimizer each data-parallel rank reduces, updates and holds the optimizer state
    of its own flat range of each parameter only, and under ``overlap_param_gather`` the other ranks' ranges are
    gathered during the next forward: each rank's targets are the blocks of its own range, counted by the rank
    that holds them (the tensor-parallel replicas' rule stays). Otherwise every data-parallel replica holds the
    same whole values: with ``split_replicas`` each reads the blocks of its own even part of each dense
    parameter's flat range (its part of the work, merged as the shards are), else data-parallel rank 0 reads
    them whole (the snapshots of parameter-sized sites need whole tensors)."""
    parts = distributed_optimizers(optimizer)
    if not parts:
        return _replica_blocks(targets, ranks) if split_replicas and ranks.dp_size > 1 else targets
    owned = []
    for target in targets:
        param = target.param
        # the shard map holds the parameters this rank owns a part of; Megatron DDP gives every parameter it
        # trains a main_grad in its buffers
        owner = next((part for part in parts if param in part.model_param_gbuf_map), None)
        if owner is None:
            if getattr(param, "main_grad", None) is None:  # not trained (frozen): every replica holds all of it
                owned.append(target)
            continue  # else another rank owns all of it
        found = owner._get_model_param_range_map(param)["param"]
        tp_rank, tp_size = ranks.tensor_parallel(param)
        base = parameter_placement(param, tp_rank=tp_rank, tp_size=tp_size, dp_rank=0)
        for box, first, end in flat_boxes(tuple(param.shape), int(found.start), int(found.end)):
            owned.append(ParameterTarget(target.name, param, box_placement(base, box), box,
                                         (first - int(found.start), end - int(found.start))))
    return owned


def _replica_blocks(targets: list[ParameterTarget], ranks: ParallelRanks) -> list[ParameterTarget]:
    """Each dense parameter that data-parallel rank 0 would count, as the blocks of this rank's even part of
    its flat range (``[n * r // dp, n * (r + 1) // dp)``); experts (their own replica groups), frozen
    parameters and the replicas no rank counts stay as they are."""
    owned = []
    for target in targets:
        param = target.param
        tp_rank, tp_size = ranks.tensor_parallel(param)
        base = parameter_placement(param, tp_rank=tp_rank, tp_size=tp_size, dp_rank=0)
        if is_expert_parameter(param) or getattr(param, "main_grad", None) is None or not base.contributes:
            owned.append(target)
            continue
        size, rank = ranks.dp_size, ranks.dp_rank
        count = param.numel()
        for box, _, _ in flat_boxes(tuple(param.shape), count * rank // size, count * (rank + 1) // size):
            owned.append(ParameterTarget(target.name, param, box_placement(base, box), box))
    return owned


def activation_modules(chunks: list[torch.nn.Module]) -> list[tuple[str, torch.nn.Module]]:
    """(canonical name, module) of every module whose output is an ``act`` site. A HybridModel's attention
    layer holds an ``IdentityOp`` MLP and its MLP layer an ``IdentityOp`` attention: those compute nothing
    and have no site."""
    from megatron.core.transformer.identity_op import IdentityOp

    found = []
    for chunk in chunks:
        model = unwrap(chunk)
        names, hybrid = site_names(model), hybrid_pattern(model) is not None
        for local_name, module in model.named_modules():
            name = names(local_name) if local_name else ""
            if hybrid and isinstance(module, IdentityOp):
                continue
            if name and ACTIVATION_MODULES.match(name):
                found.append((name, module))
    return found


def is_feature_sharded(module: torch.nn.Module) -> bool:
    """True when the module's output is split over TP ranks along its last dimension."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    return isinstance(module, ColumnParallelLinear) and not module.gather_output


def first_tensor(output: Any) -> torch.Tensor | None:
    """Megatron modules return a tensor or a tuple (output, bias / context): the first tensor."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next((o for o in output if isinstance(o, torch.Tensor)), None)
    return None


def adam_moments(optimizer: Any, targets: list[ParameterTarget]) -> list[tuple[ParameterTarget, torch.Tensor,
                                                                                    torch.Tensor]]:
    """(target, exp_avg, exp_avg_sq) for every parameter the optimizer has state for, each the target's block.

    Understands the workbench's CPU optimizer, the runner's adapter of Megatron's optimizer (``wrapped``),
    Megatron's ``ChainedOptimizer`` (each of ``chained_optimizers``), its distributed optimizer (the state of this
    rank's shards), its mixed-precision and fp32 optimizers (through their fp32 master copies) and plain torch
    optimizers.
    """
    if hasattr(optimizer, "moments"):
        by_name = {t.name: t for t in targets}
        return [(by_name[name], m, v) for name, m, v in optimizer.moments() if name in by_name]
    masters: dict[int, torch.Tensor] = {}
    states: list[Any] = []
    sharded = distributed_optimizers(optimizer)
    for part in optimizers(optimizer):
        if part in sharded:
            continue
        for model_group, master_group in zip(getattr(part, "float16_groups", []),
                                             getattr(part, "fp32_from_float16_groups", [])):
            masters.update({id(p): m for p, m in zip(model_group, master_group)})
        states.append(getattr(getattr(part, "optimizer", part), "state", {}))
    found = []
    for target in targets:
        owner = next((part for part in sharded if target.param in part.model_param_group_index_map), None)
        if owner is not None:
            entry = owner._get_main_param_and_optimizer_states(target.param)
            if "exp_avg" in entry and "exp_avg_sq" in entry:
                found.append((target, target.of_shard(entry["exp_avg"]), target.of_shard(entry["exp_avg_sq"])))
            continue
        key = masters.get(id(target.param), target.param)
        entry = next((state[key] for state in states if key in state), None)
        if entry and "exp_avg" in entry and "exp_avg_sq" in entry:
            found.append((target, target.view(entry["exp_avg"]), target.view(entry["exp_avg_sq"])))
    return found


def optimizers(optimizer: Any) -> list[Any]:
    """The optimizers that hold state, under the runner's adapter and Megatron's ``ChainedOptimizer``."""
    optimizer = getattr(optimizer, "wrapped", optimizer)
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is not None:
        return [part for inner in chained for part in optimizers(inner)]
    return [optimizer]

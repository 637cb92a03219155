"""Emulated GPU nondeterminism for CPU runs, one emulation per source (``workbench.determinism.SOURCES``).

CPU kernels accumulate in a fixed order, so a CPU run is reproducible even with
Megatron's deterministic mode off. On a GPU the word-embedding backward accumulates the
gradient rows of repeated tokens with atomics, in an order that changes from run to run.
This module reproduces that on CPU: the embedding's backward adds the per-token gradient
rows into the weight gradient with ``index_add_`` in a random order drawn from
``os.urandom``, so two runs of the same config differ in the last bits of that gradient
and, through training, everywhere. The manifest lists what was emulated (``EMULATED``).

The other sources change an accumulation order in the same way (``install`` puts on the ones
a run has on): the attention backward (dQ summed over key blocks, dK and dV over query
blocks), split-K GEMMs (the MLP's first GEMM as K-chunks), and the data-parallel gradient
all-reduce (the ranks' contributions) and, in a MoE layer, the unpermute that adds the expert
outputs back into token order. Each sums three or more partial results in an order drawn
from ``os.urandom``: with two, a + b = b + a exactly and nothing would change.
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import VocabParallelEmbedding
from megatron.core.tensor_parallel.mappings import (
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)

EMULATED = ["embedding.word_embeddings.weight: weight-gradient rows accumulated in a random order "
            "(index_add_ over a permutation seeded from os.urandom), standing in for GPU atomics"]


class _PermutedEmbedding(torch.autograd.Function):
    """``F.embedding`` whose weight gradient is accumulated in a non-reproducible order."""

    @staticmethod
    def forward(ctx, indices: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(indices)
        ctx.num_rows = weight.shape[0]
        return F.embedding(indices, weight)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        (indices,) = ctx.saved_tensors
        flat_index = indices.reshape(-1)                              # [tokens]
        rows = grad_output.reshape(-1, grad_output.shape[-1])          # [tokens, hidden]
        generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        order = torch.randperm(flat_index.numel(), generator=generator, device="cpu").to(flat_index.device)
        grad_weight = torch.zeros(ctx.num_rows, rows.shape[-1], dtype=rows.dtype, device=rows.device)
        grad_weight.index_add_(0, flat_index[order], rows[order])
        return None, grad_weight


def _forward(self: VocabParallelEmbedding, input_: torch.Tensor) -> torch.Tensor:
    # Megatron's VocabParallelEmbedding.forward (0.16.1) with F.embedding replaced by the
    # permuted-accumulation embedding.
    if self.tp_group.size() > 1:
        input_mask = (input_ < self.vocab_start_index) | (input_ >= self.vocab_end_index)
        masked_input = input_.clone() - self.vocab_start_index
        masked_input[input_mask] = 0
    else:
        masked_input = input_
    output_parallel = _PermutedEmbedding.apply(masked_input, self.weight)
    if self.tp_group.size() > 1:
        output_parallel[input_mask, :] = 0.0
    if self.reduce_scatter_embeddings:  # sequence parallelism: [b, s, h] -> [s, b, h], scattered over TP
        output_parallel = output_parallel.transpose(0, 1).contiguous()
        return reduce_scatter_to_sequence_parallel_region(output_parallel, group=self.tp_group)
    return reduce_from_tensor_model_parallel_region(output_parallel, group=self.tp_group)


def emulate_atomics(model: torch.nn.Module) -> list[str]:
    """Make the word embeddings of ``model`` accumulate gradients nondeterministically."""
    found = []
    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding):
            module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]
            found.append(module)
    return EMULATED if found else []


def _random_order(count: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    return torch.randperm(count, generator=generator)


def _sum_in_order(parts: list[torch.Tensor], order: list[int]) -> torch.Tensor:
    total = parts[order[0]].clone()
    for i in order[1:]:
        total += parts[i]
    return total


def _shuffled_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """The sum of ``parts``, added one after another in a random order (as atomics would)."""
    return _sum_in_order(parts, _random_order(len(parts)).tolist())


def _blocks(length: int, most: int) -> list[slice]:
    """At least three blocks (where ``length`` allows) of at most ``most`` items."""
    size = max(1, min(most, length // 3))
    return [slice(start, min(start + size, length)) for start in range(0, length, size)]


class _Replaced(torch.autograd.Function):
    """``value`` in place of ``output`` in the forward; the gradient goes to ``output``'s graph."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, value: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return value

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return grad, None


SPLITK_CHUNK = 16
"""Columns of the inner (K) dimension per chunk of the emulated split-K GEMM."""


def _splitk_hook(module: torch.nn.Module, args: tuple, output: tuple) -> tuple:  # type: ignore[type-arg]
    x, weight, bias_param = args[0], module.weight, module.bias
    assert isinstance(weight, torch.Tensor)
    with torch.no_grad():
        parts = [torch.matmul(x[..., k].float(), weight[:, k].float().t()) for k in _blocks(x.shape[-1], SPLITK_CHUNK)]
        value = _shuffled_sum(parts)
        bias = output[1]
        if isinstance(bias_param, torch.Tensor) and not module.skip_bias_add:
            value += bias_param.float()
        value = value.to(output[0].dtype)
    return (_Replaced.apply(output[0], value), bias)


ATTENTION_BLOCK = 8
"""Positions per block of the emulated attention backward."""


class _ReorderedAttentionBackward(torch.autograd.Function):
    """The core attention's output unchanged; its backward recomputed from q, k, v (as flash attention does)
    with dQ summed over key blocks and dK, dV over query blocks in a random order."""

    @staticmethod
    def forward(ctx, context: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,  # type: ignore[override]
                mask: torch.Tensor | None, scale: float) -> torch.Tensor:
        ctx.save_for_backward(query, key, value, mask)
        ctx.scale = scale
        return context.view_as(context)

    @staticmethod
    def backward(ctx, grad_context: torch.Tensor):  # type: ignore[override]
        query, key, value, mask = ctx.saved_tensors
        sq, b, n, hn = query.shape
        sk = key.shape[0]

        def heads(t: torch.Tensor, length: int) -> torch.Tensor:  # [s, b, n, hn] -> [b * n, s, hn], fp32
            return t.float().permute(1, 2, 0, 3).reshape(b * n, length, hn)

        q, k, v = heads(query, sq), heads(key, sk), heads(value, sk)
        d_out = heads(grad_context.reshape(sq, b, n, hn), sq)
        scores = torch.bmm(q, k.transpose(1, 2)) * ctx.scale
        if mask is not None:
            scores = scores.view(b, n, sq, sk).masked_fill(mask, float("-inf")).view(b * n, sq, sk)
        probs = torch.softmax(scores, dim=-1)
        d_probs = torch.bmm(d_out, v.transpose(1, 2))
        d_scores = probs * (d_probs - (d_probs * probs).sum(dim=-1, keepdim=True)) * ctx.scale
        queries, keys = _blocks(sq, ATTENTION_BLOCK), _blocks(sk, ATTENTION_BLOCK)
        d_v = _shuffled_sum([torch.bmm(probs[:, j].transpose(1, 2), d_out[:, j]) for j in queries])
        d_k = _shuffled_sum([torch.bmm(d_scores[:, j].transpose(1, 2), q[:, j]) for j in queries])
        d_q = _shuffled_sum([torch.bmm(d_scores[:, :, i], k[:, i]) for i in keys])

        def back(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:  # [b * n, s, hn] -> [s, b, n, hn]
            return t.view(b, n, like.shape[0], hn).permute(2, 0, 1, 3).to(like.dtype)

        return None, back(d_q, query), back(d_k, key), back(d_v, value), None, None


def _attention_hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:  # type: ignore[type-arg]
    query, key, value = args[:3]
    mask = args[3] if len(args) > 3 else kwargs.get("attention_mask")
    if mask is None and "causal" in str(getattr(module, "attn_mask_type", "")):  # Megatron's implicit causal mask
        mask = torch.ones(query.shape[0], key.shape[0], dtype=torch.bool, device=query.device).triu(1)[None, None]
    return _ReorderedAttentionBackward.apply(output, query, key, value, mask, float(module.softmax_scale))  # type: ignore[arg-type]


def _check_attention(module: Any) -> None:
    config = module.config
    problems = [what for what, bad in (
        ("attention dropout", config.attention_dropout > 0),
        ("grouped-query attention", module.num_query_groups_per_partition != module.num_attention_heads_per_partition),
        ("query-key layer scaling", getattr(config, "apply_query_key_layer_scaling", False)),
        ("a softmax offset", getattr(config, "softmax_type", "vanilla") != "vanilla"),
    ) if bad]
    if problems:
        raise ValueError(f"the emulated attention backward does not support {', '.join(problems)}")


def _associated_sum(tensor: torch.Tensor, group: torch.distributed.ProcessGroup, average: bool) -> None:
    """All-reduce ``tensor`` over ``group`` summing the ranks' contributions in a random order, the same on
    every rank (drawn on the group's first rank and broadcast), so the replicas stay equal to each other."""
    import torch.distributed as dist

    size = dist.get_world_size(group)
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor, group=group)
    order = _random_order(size) if dist.get_rank(group) == 0 else torch.empty(size, dtype=torch.int64)
    dist.broadcast(order, src=dist.get_global_rank(group, 0), group=group)
    total = _sum_in_order(parts, order.tolist())
    tensor.copy_(total / size if average else total)


def _emulated_grad_sync(self: Any, force_all_reduce: bool | None = False) -> None:
    # Megatron's _ParamAndGradBucketGroup.start_grad_sync (0.16.1) for the runner's configuration (synchronous,
    # no distributed optimizer), with each bucket's all-reduce replaced by ``_associated_sum``.
    for bucket in self.buckets:
        if bucket.gradient_scaling_factor != 1.0:
            bucket.grad_data *= bucket.gradient_scaling_factor
    for bucket in self.buckets:
        _associated_sum(bucket.grad_data, self.data_parallel_group, self.ddp_config.average_in_collective)
    self.grad_reduce_handle = None


def _shuffled_unpermute(permuted: torch.Tensor, sorted_indices: torch.Tensor,
                        restore_shape: torch.Size) -> torch.Tensor:
    """Megatron's ``unpermute`` without probabilities (the allgather dispatcher's combine): each expert output
    row added into its token's row, the rows taken in a random order as GPU atomics would."""
    order = _random_order(sorted_indices.numel()).to(sorted_indices.device)
    output = torch.zeros(restore_shape, dtype=permuted.dtype, device=permuted.device)
    return output.index_add(0, sorted_indices[order], permuted[order])


def _combine_preprocess(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    # MoEAllGatherTokenDispatcher.combine_preprocess (0.16.1), its unpermute in a random order.
    return _shuffled_unpermute(hidden_states, self.reversed_local_input_permutation_mapping,
                               self.hidden_shape_before_permute)


def emulate_token_combine(model: torch.nn.Module) -> int:
    """Make every MoE layer's token combine accumulate in a random order; the number of layers changed."""
    from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher

    dispatchers: list[Any] = [m.token_dispatcher for m in model.modules()
                   if isinstance(getattr(m, "token_dispatcher", None), MoEAllGatherTokenDispatcher)]
    for dispatcher in dispatchers:
        if dispatcher.config.moe_permute_fusion:
            raise ValueError("the emulated token combine replaces the unfused unpermute (moe_permute_fusion off)")
        dispatcher.combine_preprocess = types.MethodType(_combine_preprocess, dispatcher)
    return len(dispatchers)


def install(built: Any, states: Mapping[str, Any]) -> list[str]:
    """Put on the CPU emulations of the sources that are on in ``states`` (``workbench.determinism.resolve``)
    in ``built`` (``workbench.runner.model.BuiltModel``); what each does, for the manifest."""
    from workbench.determinism import SOURCES, SourceState

    on = {name for name, state in states.items() if state is SourceState.ON}
    done: list[str] = []
    if "embedding_atomics" in on:
        done += emulate_atomics(torch.nn.ModuleList(built.gpts))
    if "splitk_gemm" in on:
        from megatron.core.tensor_parallel.layers import ColumnParallelLinear

        linears = [m for n, m in built.named_modules() if n.endswith("mlp.linear_fc1")
                   and isinstance(m, ColumnParallelLinear)]
        for linear in linears:
            if linear.sequence_parallel:
                raise ValueError("the emulated split-K GEMM does not support sequence parallelism")
            linear.register_forward_hook(_splitk_hook)
        done += [f"{SOURCES['splitk_gemm'].cpu} ({len(linears)} GEMMs)"] if linears else []
    if "attention_backward" in on:
        from megatron.core.transformer.dot_product_attention import DotProductAttention

        cores = [m for m in built.modules() if isinstance(m, DotProductAttention)]
        for core in cores:
            _check_attention(core)
            core.register_forward_hook(_attention_hook, with_kwargs=True)
        done += [f"{SOURCES['attention_backward'].cpu} ({len(cores)} layers)"] if cores else []
    if "dp_allreduce" in on:
        groups = [g for chunk in built.chunks for g in chunk.bucket_groups + chunk.expert_parallel_bucket_groups]
        for group in groups:
            if group.ddp_config.use_distributed_optimizer or group.ddp_config.overlap_grad_reduce:
                raise ValueError("the emulated all-reduce needs overlap_grad_reduce and the distributed optimizer off")
            group.start_grad_sync = types.MethodType(_emulated_grad_sync, group)
        done += [str(SOURCES["dp_allreduce"].cpu)] if groups else []
    if "moe_token_combine" in on:
        layers = sum(emulate_token_combine(gpt) for gpt in built.gpts)
        done += [f"{SOURCES['moe_token_combine'].cpu} ({layers} layers)"] if layers else []
    missing = sorted(on - {"embedding_atomics", "splitk_gemm", "attention_backward", "dp_allreduce",
                           "moe_token_combine"})
    if missing:
        raise ValueError(f"no CPU emulation of {', '.join(missing)}")
    return done

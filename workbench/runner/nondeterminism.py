"""Emulated GPU nondeterminism for CPU runs.

CPU kernels accumulate in a fixed order, so a CPU run is reproducible even with
Megatron's deterministic mode off. On a GPU the word-embedding backward accumulates the
gradient rows of repeated tokens with atomics, in an order that changes from run to run.
This module reproduces that on CPU: the embedding's backward adds the per-token gradient
rows into the weight gradient with ``index_add_`` in a random order drawn from
``os.urandom``, so two runs of the same config differ in the last bits of that gradient
and, through training, everywhere. The manifest lists what was emulated (``EMULATED``).
"""

from __future__ import annotations

import os
import types

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import VocabParallelEmbedding
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

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
    # Megatron's VocabParallelEmbedding.forward (0.16.1) without sequence parallelism,
    # with F.embedding replaced by the permuted-accumulation embedding.
    if self.tp_group.size() > 1:
        input_mask = (input_ < self.vocab_start_index) | (input_ >= self.vocab_end_index)
        masked_input = input_.clone() - self.vocab_start_index
        masked_input[input_mask] = 0
    else:
        masked_input = input_
    output_parallel = _PermutedEmbedding.apply(masked_input, self.weight)
    if self.tp_group.size() > 1:
        output_parallel[input_mask, :] = 0.0
    return reduce_from_tensor_model_parallel_region(output_parallel, group=self.tp_group)


def emulate_atomics(model: torch.nn.Module) -> list[str]:
    """Make the word embeddings of ``model`` accumulate gradients nondeterministically."""
    found = []
    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding):
            if module.reduce_scatter_embeddings:
                raise ValueError("emulated nondeterminism does not support sequence parallelism")
            module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]
            found.append(module)
    return EMULATED if found else []

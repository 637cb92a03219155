"""Megatron-LM's tensor dumps of a one-layer MLP and its MoE router traces, written here in their documented
formats (``workbench/megatron_lm/dumps.py``, ``router_traces.py``): for the importer's tests, its fuzzing and
the run-store contract."""

from __future__ import annotations

import json
from pathlib import Path

import torch

SEQ, BATCH, HIDDEN, FFN = 4, 2, 8, 16


def full_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """The whole tensors the dumps are shards of (random, from ``seed``)."""
    generator = torch.Generator().manual_seed(seed)
    return {"fc1.weight": torch.randn(FFN, HIDDEN, generator=generator),
            "fc2.weight": torch.randn(HIDDEN, FFN, generator=generator),
            "norm.weight": torch.randn(HIDDEN, generator=generator),
            "fc1.in": torch.randn(SEQ, BATCH, HIDDEN, generator=generator),
            "fc1.out": torch.randn(SEQ, BATCH, FFN, generator=generator),
            "fc2.out": torch.randn(SEQ, BATCH, HIDDEN, generator=generator)}


def write_dumps(save: Path, tp: int, full: dict[str, torch.Tensor], iterations: tuple[int, ...] = (1, 2),
                extra: dict[str, object] | None = None) -> Path:
    """Megatron-LM's dumps of a one-layer MLP at ``tp``: fc1 column-parallel, fc2 row-parallel."""
    mlp = "decoder.layers.0.mlp"
    for iteration in iterations:
        for rank in range(tp):
            def shard(x: torch.Tensor, dim: int, rank: int = rank) -> torch.Tensor:
                return x.chunk(tp, dim=dim)[rank].clone()

            params = {f"{mlp}.linear_fc1.weight": shard(full["fc1.weight"], 0),
                      f"{mlp}.linear_fc2.weight": shard(full["fc2.weight"], 1),
                      "decoder.layers.0.pre_mlp_layernorm.weight": full["norm.weight"].clone()}
            activations = {f"{mlp}.linear_fc1/input0": full["fc1.in"].clone(),
                           f"{mlp}.linear_fc1/output0": shard(full["fc1.out"], 2),
                           f"{mlp}.linear_fc2/input0": shard(full["fc1.out"], 2),
                           f"{mlp}.linear_fc2/output0": full["fc2.out"].clone(), **(extra or {})}
            for kind, content in (("params", params), ("activations", activations)):
                folder = save / kind / f"iter_{iteration:07d}"
                folder.mkdir(parents=True, exist_ok=True)
                torch.save({"model_chunk0": content}, folder / f"mp_rank_{rank:02d}.pth")
    return save


EXPERTS, TOPK, TOKENS, MICRO_BATCHES, RANKS, STEPS, LAYERS = 4, 2, 6, 2, 2, 3, 2
"""The router traces' shape: experts, choices per token, tokens, micro-batches, data replicas, steps, layers."""


def router_choices(seed: int = 0) -> torch.Tensor:
    """int32 [steps, layers, ranks (data replicas), micro-batches, tokens, topk]: distinct experts per token."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand(STEPS, LAYERS, RANKS, MICRO_BATCHES, TOKENS, EXPERTS, generator=generator)
    return scores.topk(TOPK, dim=-1).indices.to(torch.int32)


def write_router_traces(folder: Path, choices: torch.Tensor) -> Path:
    """The tracer's lines as its docstring gives them: one per router call (micro-batch and layer)."""
    folder.mkdir(parents=True)
    for rank in range(RANKS):
        lines = [json.dumps({"step": step, "stage": "pre_dispatch", "block": "decoder", "layer": layer, "rank": rank,
                             "num_tokens": TOKENS, "topk": TOPK, "top_indices": choices[step, layer, rank, k].tolist()})
                 for step in range(STEPS) for k in range(MICRO_BATCHES) for layer in range(LAYERS)]
        (folder / f"router_trace_rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    return folder

"""Checkpoints: the full training state before a step, saved per rank, loaded without code.

``checkpoints/step_<K>/`` holds the state after K updates:

    model_tp<T>_pp<P>.pt   parameters (canonical names, this rank's TP shard), optimizer and
                           LR-schedule state; written by the lowest rank of each shard's replicas
                           (``_ep<E>`` added with experts split over EP ranks: each holds its experts)
    rank<R>.pt             RNG state of global rank R
    megatron/              with ``checkpoint_format = "megatron"``: the model's sharded state dict
                           through ``megatron.core.dist_checkpointing`` (torch_dist backend)
    meta.json              step, layout, config hash; written last, after a barrier, so a
                           checkpoint without it is incomplete and never loaded

Files hold only tensors, numbers, strings and containers, and are read with
``torch.load(..., weights_only=True)``: loading a checkpoint never runs code from it.
The data position is the step itself (samples are a function of their index).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

from workbench.errors import CheckpointError
from workbench.recorder.targets import ParallelRanks
from workbench.store.layout import MEGATRON_CHECKPOINT, RunPaths


def _model_file(directory: Path) -> Path:
    """This rank's model file: one per (TP rank, PP rank) and, with experts split, per EP rank."""
    name = f"model_tp{ps.get_tensor_model_parallel_rank()}_pp{ps.get_pipeline_model_parallel_rank()}"
    if ps.get_expert_model_parallel_world_size() > 1:
        name += f"_ep{ps.get_expert_model_parallel_rank()}"
    return directory / f"{name}.pt"


def _writes_model_file(directory: Path) -> bool:
    """True on the lowest global rank of those sharing this rank's model file (its DP replicas)."""
    mine = _model_file(directory).name
    files: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(files, mine)
    return files.index(mine) == dist.get_rank()


def _shard_info(param: torch.Tensor) -> list[int] | None:
    """[partition dim, TP rank, TP size] of a tensor-parallel parameter, None for a replica."""
    if not getattr(param, "tensor_model_parallel", False):
        return None
    rank, size = ParallelRanks.current().tensor_parallel(param)
    return [int(param.partition_dim), rank, size] if size > 1 else None  # type: ignore[attr-defined]


def _sharded_state(gpt: torch.nn.Module) -> dict[str, Any]:
    return gpt.sharded_state_dict()  # type: ignore[operator, no-any-return]


def save_megatron(directory: Path, gpts: list[torch.nn.Module]) -> None:
    """The model chunks' sharded state dicts through ``dist_checkpointing`` into ``directory/megatron``
    (collective; keys carry global layer numbers, so virtual stages' chunks merge into one dict)."""
    from megatron.core import dist_checkpointing

    target = directory / MEGATRON_CHECKPOINT
    if dist.get_rank() == 0:
        target.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    merged: dict[str, Any] = {}
    for gpt in gpts:
        merged.update(_sharded_state(gpt))
    dist_checkpointing.save(merged, str(target))


def load_megatron(directory: Path, gpts: list[torch.nn.Module]) -> None:
    """Load ``directory/megatron`` into the model chunks, resharded by Megatron for this layout (collective)."""
    from megatron.core import dist_checkpointing

    for gpt in gpts:
        state = dist_checkpointing.load(_sharded_state(gpt), str(directory / MEGATRON_CHECKPOINT))
        missing, unexpected = gpt.load_state_dict(state, strict=False)
        wanted = [k for k in missing if not k.endswith("_extra_state")]
        if wanted or unexpected:
            raise CheckpointError(f"{directory / MEGATRON_CHECKPOINT}: does not fit this model (missing {wanted[:3]}, "
                                  f"unexpected {list(unexpected)[:3]})")


def has_megatron(directory: Path) -> bool:
    return (Path(directory) / MEGATRON_CHECKPOINT / "metadata.json").is_file()


def save(paths: RunPaths, step: int, *, params: list[tuple[str, torch.Tensor]], optimizer: dict[str, Any],
         scheduler: dict[str, Any], meta: dict[str, Any], megatron: list[torch.nn.Module] | None = None) -> Path:
    """Save the state before ``step`` (collective); with ``megatron`` (the model chunks) also in Megatron's
    distributed format."""
    directory = paths.checkpoint(step)
    directory.mkdir(parents=True, exist_ok=True)
    if megatron is not None:
        save_megatron(directory, megatron)
    rank = dist.get_rank()
    if _writes_model_file(directory):
        state = {
            "step": step,
            "params": {name: p.detach().cpu().clone() for name, p in params},
            "shards": {name: _shard_info(p) for name, p in params},
            "optimizer": optimizer,
            "scheduler": scheduler,
        }
        _atomic_save(state, _model_file(directory))
    _atomic_save({"rng": torch.get_rng_state()}, directory / f"rank{rank}.pt")
    dist.barrier()
    if rank == 0:
        (directory / "meta.json").write_text(json.dumps({"step": step, **meta}, indent=1))
    dist.barrier()
    return directory


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_suffix(".partial")
    torch.save(obj, tmp)
    tmp.replace(path)


def latest_step(paths: RunPaths) -> int:
    steps = paths.checkpoint_steps()
    if not steps:
        raise CheckpointError(f"{paths.checkpoints}: no complete checkpoint to resume from "
                              "(set checkpoint_every in the config)")
    return steps[-1]


def read_meta(paths: RunPaths, step: int) -> dict[str, Any]:
    return read_meta_at(paths.checkpoint(step))


def read_meta_at(directory: Path) -> dict[str, Any]:
    return json.loads((Path(directory) / "meta.json").read_text())


def load(paths: RunPaths, step: int) -> dict[str, Any]:
    """This rank's model/optimizer state at ``step``; restores the rank's RNG state too."""
    directory = paths.checkpoint(step)
    state = torch.load(_model_file(directory), weights_only=True)
    rng = torch.load(directory / f"rank{dist.get_rank()}.pt", weights_only=True)
    torch.set_rng_state(rng["rng"])
    return state


def _checkpoint_files(directory: Path) -> list[Path]:
    files = sorted(directory.glob("model_tp*_pp*.pt"))
    if not files or not (directory / "meta.json").is_file():
        raise CheckpointError(f"{directory}: not a complete checkpoint")
    return files


def _merge(pieces: list[tuple[dict[str, torch.Tensor], dict[str, list[int] | None]]]) -> dict[str, torch.Tensor]:
    """Full tensors from (tensors by name, shard info by name) of each file: TP shards concatenated, replicas
    (the same tensor in several files: other EP ranks' files repeat the dense parameters) taken once."""
    shards: dict[str, dict[int, torch.Tensor]] = {}
    dims: dict[str, int | None] = {}
    for tensors, infos in pieces:
        for name, tensor in tensors.items():
            info = infos[name]
            dims[name] = None if info is None else info[0]
            shards.setdefault(name, {}).setdefault(0 if info is None else info[1], tensor)
    full = {}
    for name, parts in shards.items():
        dim = dims[name]
        ordered = [parts[rank] for rank in sorted(parts)]
        full[name] = ordered[0] if dim is None else torch.cat(ordered, dim=dim)
    return full


def load_full_params(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every parameter of a checkpoint as its full, unsharded tensor (TP shards concatenated)."""
    states = [torch.load(f, weights_only=True) for f in _checkpoint_files(Path(directory))]
    return _merge([(state["params"], state["shards"]) for state in states])


def load_full_state(directory: str | Path) -> dict[str, Any]:
    """A checkpoint as full tensors, for a run of another layout to start from: ``params`` and, per name,
    the optimizer's ``master``, ``exp_avg``, ``exp_avg_sq`` and ``step``; the ``scheduler`` state and the
    ``optimizer`` state of one file (its hyper-parameters and loss scaler)."""
    from workbench.runner.optimizer import adam_order

    states = [torch.load(f, weights_only=True) for f in _checkpoint_files(Path(directory))]
    if any("masters" not in state["optimizer"] for state in states):
        raise CheckpointError(f"{directory}: written by Megatron's own optimizer (a GPU run); starting another "
                              "layout from it needs the CPU runner's optimizer state")
    pieces: dict[str, list[tuple[dict[str, torch.Tensor], dict[str, list[int] | None]]]] = {
        key: [] for key in ("params", "master", "exp_avg", "exp_avg_sq")}
    steps: dict[str, torch.Tensor] = {}
    for state in states:
        opt = state["optimizer"]
        names = list(opt["names"])
        order = adam_order(names, [state["params"][n].ndim for n in names])
        moments = {name: opt["adam_state"][i] for i, name in enumerate(order) if i in opt["adam_state"]}
        pieces["params"].append((state["params"], state["shards"]))
        pieces["master"].append((opt["masters"], state["shards"]))
        for key in ("exp_avg", "exp_avg_sq"):
            pieces[key].append(({n: m[key] for n, m in moments.items()}, state["shards"]))
        steps.update({n: m["step"] for n, m in moments.items()})
    full = {key: _merge(parts) for key, parts in pieces.items()}
    named = {name: {"master": full["master"][name], "step": steps[name], "exp_avg": full["exp_avg"][name],
                    "exp_avg_sq": full["exp_avg_sq"][name]} if name in steps else {"master": full["master"][name]}
             for name in full["params"]}
    return {"params": full["params"], "optimizer_named": named, "scheduler": states[0]["scheduler"],
            "optimizer": states[0]["optimizer"]}


def shard_of(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """This rank's piece of the full tensor ``full`` of ``param`` (its TP shard, or the whole of a replica)."""
    info = _shard_info(param)
    if info is None:
        return full
    dim, rank, size = info
    return full.chunk(size, dim=dim)[rank]

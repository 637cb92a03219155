"""Checkpoints: the full training state before a step, saved per rank, loaded without running code from them.

``checkpoints/step_<K>/`` holds the state after K updates:

    model_tp<T>_pp<P>.pt   parameters (canonical names, this rank's TP shard), optimizer and
                           LR-schedule state; written by the lowest rank of each shard's replicas
                           (``_ep<E>`` added with experts split over EP ranks: each holds its experts)
    rank<R>.pt             RNG state of global rank R
    megatron/              with ``checkpoint_format = "megatron"``: the model's sharded state dict
                           through ``megatron.core.dist_checkpointing`` (torch_dist backend)
    meta.json              step, layout, config hash; written last, after a barrier, so a
                           checkpoint without it is incomplete and never loaded

Files hold only tensors, numbers, strings and containers. A checkpoint may come from elsewhere
(``--start-from`` another person's run), so every read goes through ``workbench.untrusted``, and
loading one never runs code from it: torch files load with ``weights_only=True``; ``meta.json`` is
JSON with typed fields; ``megatron/`` is checked before ``dist_checkpointing`` reads it (its
``.metadata``, a pickle that torch's loader reads with plain ``pickle.load``, through an allow-list
of classes; ``metadata.json`` as JSON; the common state, ``common.pt`` or from 0.19 the ``common_state``
entry, weights-only), and only tensors are asked of
it, each stored as one: Megatron's ShardedObjects (the layers' ``_extra_state``, empty in the local
spec) are stored as pickled bytes that torch unpickles in full, and are left out. A file that would
run code is refused with ``UntrustedFileError`` naming it; a damaged one with ``CheckpointError``.
The data position is the step itself (samples are a function of their index).
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

from workbench.errors import CheckpointError, CheckpointWriteError
from workbench.recorder.targets import ParallelRanks
from workbench.store.layout import CHECKPOINT_META, MEGATRON_CHECKPOINT, RunPaths, checkpoint_meta
from workbench.untrusted import (
    check_megatron_checkpoint,
    load_torch_file,
    refusal_in,
    refused,
)


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


def _tensors_only(sharded: dict[str, Any]) -> dict[str, Any]:
    """A sharded state dict without its ShardedObjects (stored as pickled bytes; here only the layers'
    ``_extra_state``, which the local spec's layers leave empty and ignore)."""
    from megatron.core.dist_checkpointing.dict_utils import extract_matching_values
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    return extract_matching_values(sharded, lambda v: isinstance(v, ShardedObject))[1]  # type: ignore[return-value]


def _tensor_keys(sharded: dict[str, Any] | list[Any]) -> set[str]:
    """The checkpoint keys a load of ``sharded`` reads, its factories' tensors included."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    keys: set[str] = set()
    for value in nested_values(sharded):
        if isinstance(value, ShardedTensorFactory):
            built = value.build()
            keys |= _tensor_keys(built if isinstance(built, (dict, list)) else [built])
        elif isinstance(value, ShardedTensor):
            keys.add(value.key)
    return keys


def load_megatron(directory: Path, gpts: list[torch.nn.Module]) -> None:
    """Load ``directory/megatron`` into the model chunks, resharded by Megatron for this layout (collective).

    The folder is checked first (``untrusted.check_megatron_checkpoint``), and only the chunks' tensors are
    asked for, each of which it must store as a tensor (``DcpIndex.require_tensors``)."""
    from megatron.core import dist_checkpointing
    from torch.distributed.checkpoint.api import CheckpointException

    target = directory / MEGATRON_CHECKPOINT
    index = check_megatron_checkpoint(target)
    for gpt in gpts:
        tensors = _tensors_only(_sharded_state(gpt))
        index.require_tensors(_tensor_keys(tensors))
        try:
            state = dist_checkpointing.load(tensors, str(target))
        except (Exception, CheckpointException) as err:  # noqa: B036 - DCP's error is no Exception
            what = refusal_in(err)
            if what is None:
                raise
            raise refused(target, f"holds a tensor that {what}") from None
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
    distributed format. A write that fails on any rank (a full disk, an I/O error) removes the partial
    checkpoint, so that its space comes back, and raises ``CheckpointWriteError`` on every rank."""
    directory = paths.checkpoint(step)
    rank = dist.get_rank()
    _agree(directory, _attempt(lambda: _write_state(directory, step, rank, params=params, optimizer=optimizer,
                                                    scheduler=scheduler, megatron=megatron), directory))
    # meta.json last, after every rank's files: a checkpoint without it is incomplete and never loaded
    text = json.dumps({"step": step, **meta}, indent=1, allow_nan=False)  # strict JSON: what its reader accepts
    _agree(directory, _attempt(lambda: (directory / CHECKPOINT_META).write_text(text), directory)
           if rank == 0 else None)
    return directory


def _write_state(directory: Path, step: int, rank: int, *, params: list[tuple[str, torch.Tensor]],
                 optimizer: dict[str, Any], scheduler: dict[str, Any], megatron: list[torch.nn.Module] | None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if megatron is not None:
        save_megatron(directory, megatron)
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


def _free_bytes(directory: Path) -> int | None:
    """Free space on the file system of ``directory`` (or of its nearest existing parent)."""
    for folder in (directory, *directory.parents):
        if folder.is_dir():
            return shutil.disk_usage(folder).free
    return None


def _attempt(write: Any, directory: Path) -> str | None:
    """None when ``write()`` succeeds, else what went wrong in one line (OSError's text: 'No space left on
    device'). Megatron's collective save raises ``CheckpointException`` (a BaseException) on every rank."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        write()
    except (Exception, CheckpointException) as caught:  # noqa: B036 - DCP's error is no Exception
        err: BaseException = caught
        if isinstance(caught, CheckpointException) and caught.failures:  # a rank's own error, not DCP's wrap
            inner = next(iter(caught.failures.values()))
            err = inner[0] if isinstance(inner, tuple) else inner
        text = f"{err.strerror} ({err.filename})" if isinstance(err, OSError) and err.strerror else f"{err}"
        text = f"{type(err).__name__}: {text}".splitlines()[0][:300]
        if not isinstance(err, OSError) and (free := _free_bytes(directory)) is not None and free < 2**20:
            text += f"; No space left on device ({free // 1024} KiB free)"  # torch's writers hide ENOSPC
        return text
    return None


def _agree(directory: Path, failure: str | None) -> None:
    """Every rank learns whether any rank's writes failed (in place of a barrier); if one did, rank 0
    removes the partial checkpoint and every rank raises ``CheckpointWriteError`` naming it."""
    failures: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(failures, failure)
    failed = [(rank, text) for rank, text in enumerate(failures) if text is not None]
    if not failed:
        return
    if dist.get_rank() == 0:
        shutil.rmtree(directory, ignore_errors=True)
    dist.barrier()
    rank, text = failed[0]
    raise CheckpointWriteError(f"{directory}: writing the checkpoint failed on rank {rank} ({text}); the partial "
                               "checkpoint was removed")


def _atomic_save(obj: Any, path: Path) -> None:
    """``obj`` into ``path`` whole or not at all. Serialised in memory first: torch's own file writer reports
    a full disk as an unreadable 'enforce fail' RuntimeError, Python's write as ``OSError(ENOSPC)``."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    tmp = path.with_suffix(".partial")
    # bytes, not a view of the BytesIO: a write that fails keeps its frame's memoryview (pathlib makes one of
    # what it is given) in the traceback's cycle, and a view of a BytesIO freed after its buffer by the
    # collector killed the process (SIGSEGV, in about 1 of 3 full-disk tests; releasing our own view first
    # did not stop it: pathlib's view of it stayed)
    data = buffer.getvalue()
    del buffer
    tmp.write_bytes(data)
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
    """A checkpoint's ``meta.json``, its fields checked: ``CheckpointError`` naming the file and the field."""
    return checkpoint_meta(Path(directory))


_MODEL_FILE_KEYS = ("params", "shards", "optimizer", "scheduler")


def _read_model_file(path: Path) -> dict[str, Any]:
    state = load_torch_file(path)
    lacking = [key for key in _MODEL_FILE_KEYS if not isinstance(state, dict) or key not in state]
    if lacking:
        raise CheckpointError(f"{path}: holds no {lacking[0]!r}, so it is not a model file of a workbench "
                              "checkpoint; write the checkpoint again, or copy it again from its source")
    from workbench.runner.optimizer import check_state_format

    check_state_format(state["optimizer"], str(path))
    return state  # type: ignore[no-any-return]


def load(paths: RunPaths, step: int) -> dict[str, Any]:
    """This rank's model/optimizer state at ``step``; restores the rank's RNG state too."""
    directory = paths.checkpoint(step)
    state = _read_model_file(_model_file(directory))
    path = directory / f"rank{dist.get_rank()}.pt"
    rng = load_torch_file(path)
    if not isinstance(rng, dict) or not isinstance(rng.get("rng"), torch.Tensor):
        raise CheckpointError(f"{path}: holds no RNG state, so it is not a rank file of a workbench checkpoint; "
                              "write the checkpoint again, or copy it again from its source")
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
    states = [_read_model_file(f) for f in _checkpoint_files(Path(directory))]
    return _merge([(state["params"], state["shards"]) for state in states])


def load_full_state(directory: str | Path) -> dict[str, Any]:
    """A checkpoint as full tensors, for a run of another layout to start from: ``params`` and, per name,
    the optimizer's ``master`` and (once a step was taken) ``exp_avg``, ``exp_avg_sq`` and ``step``; the
    ``scheduler`` state and the ``optimizer`` entry of one file (its loss scalers)."""
    states = [_read_model_file(f) for f in _checkpoint_files(Path(directory))]
    pieces: dict[str, list[tuple[dict[str, torch.Tensor], dict[str, list[int] | None]]]] = {
        key: [] for key in ("params", "master", "exp_avg", "exp_avg_sq")}
    steps: dict[str, torch.Tensor] = {}
    for state in states:
        opt = state["optimizer"]
        pieces["params"].append((state["params"], state["shards"]))
        pieces["master"].append((opt["masters"], state["shards"]))
        for key in ("exp_avg", "exp_avg_sq"):
            pieces[key].append(({n: m[key] for n, m in opt["moments"].items()}, state["shards"]))
        steps.update({n: m["step"] for n, m in opt["moments"].items()})
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

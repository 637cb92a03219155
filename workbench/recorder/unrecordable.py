"""What the recorder cannot record right, said before anything is recorded: a configuration whose numbers it would
get wrong is refused in one line at ``record(...)``; one where only some kinds would be wrong or missing records
the rest and names those kinds in the manifest's ``kinds_missing``, with the reason. Never a wrong number, never a
silent gap.

Refused:

* Megatron's distributed optimizer (``use_distributed_optimizer``, ZeRO-1) when ``record`` is not handed it: each
  DP rank reduces, updates and keeps the state of its own shard only, and only the optimizer says which shard
  that is (handed it, the recorder reads each rank's shards: ``targets.owned_targets``). A distributed optimizer
  of a kind the recorder does not know (without Megatron's shard map) likewise.
* Megatron FSDP and torch FSDP2 (``use_megatron_fsdp``, ``use_custom_fsdp``, ``use_torch_fsdp2``): the
  parameters themselves are sharded.
* Snapshots of parameter-sized sites under the distributed optimizer (``sharded_snapshots``): a snapshot's chunks
  are its pieces, one per rank, and a rank's shard of a parameter is an uneven run of rows, so two ranks would
  write into one chunk.
* CUDA graphs (``enable_cuda_graph``, ``external_cuda_graph``, ``cuda_graph_impl``): a captured layer replays
  without its module hooks, so its activation sites would vanish.

Named missing:

* ``grad_local`` under ``overlap_grad_reduce`` with more than one data-parallel replica: the reductions start
  during the backward pass, bucket by bucket, so at ``finalize_model_grads``, where ``grad_local`` is read, part
  of the buffer is already reduced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from workbench.recorder.targets import distributed_optimizers, optimizers, unwrap
from workbench.sites import PARAMETER_KINDS, site_id

RECORD_WITHOUT = "record with it off, or record a smaller run of the same model without it; nothing was written"


def _classes(obj: Any) -> list[str]:
    return [cls.__name__ for cls in type(obj).__mro__]


def refusal(chunks: Sequence[Any], optimizer: Any = None) -> str | None:
    """One line saying why the recorder cannot record this training right, or None if it can."""
    for chunk in chunks:
        if any("FullyShardedDataParallel" in name for name in _classes(chunk)):
            return (f"record() cannot record a model wrapped in {type(chunk).__name__}: FSDP shards the parameters "
                    f"and gradients themselves, and the recorder reads them whole; {RECORD_WITHOUT}")
        ddp = getattr(chunk, "ddp_config", None)
        if getattr(ddp, "use_megatron_fsdp", False) or getattr(ddp, "use_custom_fsdp", False):
            return ("record() cannot record Megatron FSDP (use_megatron_fsdp): it shards the parameters and gradients "
                    f"themselves, and the recorder reads them whole; {RECORD_WITHOUT}")
        if getattr(ddp, "use_distributed_optimizer", False) and not distributed_optimizers(optimizer):
            return _DISTRIBUTED_OPTIMIZER_NOT_PASSED
    known = distributed_optimizers(optimizer)
    for part in optimizers(optimizer) if optimizer is not None else []:
        if any("DistributedOptimizer" in name for name in _classes(part)) and part not in known:
            return (f"record() cannot record {type(part).__name__}: it shards the optimizer without Megatron's "
                    f"shard map (_get_model_param_range_map), so the recorder cannot tell which part of each "
                    f"gradient this rank reduced; {RECORD_WITHOUT}")
    config = getattr(unwrap(chunks[0]), "config", None) if chunks else None
    if getattr(config, "use_torch_fsdp2", False):
        return ("record() cannot record torch FSDP2 (use_torch_fsdp2): it shards the parameters and gradients "
                f"themselves, and the recorder reads them whole; {RECORD_WITHOUT}")
    graphs = [name for name in ("enable_cuda_graph", "external_cuda_graph") if getattr(config, name, False)]
    impl = getattr(config, "cuda_graph_impl", "none")
    if impl not in (None, "none"):
        graphs.append(f"cuda_graph_impl={impl!r}")
    if graphs:
        return (f"record() cannot record CUDA-graphed layers ({', '.join(graphs)}): a captured layer replays without "
                f"its module hooks, so its activation sites would vanish; {RECORD_WITHOUT}")
    return None


_DISTRIBUTED_OPTIMIZER_NOT_PASSED = (
    "record() needs the optimizer under Megatron's distributed optimizer (use_distributed_optimizer): each "
    "data-parallel rank reduces only its own shard of the gradients, and only the optimizer says which; pass it, "
    "as in record(run_dir, model, optimizer, ...); nothing was written")


def sharded_snapshots(owned: Sequence[Any], kinds: Iterable[str], snapshotted: Callable[[str], bool]) -> str | None:
    """One line refusing snapshots of the parameter-sized sites that ``owned`` reads in blocks of a distributed
    optimizer's shards (``targets.owned_targets``), or None."""
    asked = sorted({site_id(kind, target.name) for target in owned if target.box is not None
                    for kind in kinds if kind in PARAMETER_KINDS and snapshotted(site_id(kind, target.name))})
    if not asked:
        return None
    return (f"record() cannot yet take snapshots of parameter-sized sites under Megatron's distributed optimizer "
            f"({asked[0]}{f' and {len(asked) - 1} more' if len(asked) > 1 else ''}): each rank holds an uneven "
            f"part of each parameter, and a snapshot is written in one chunk per rank's part; snapshot only "
            f"activation sites (snapshot_sites), or record without the snapshots; nothing was written")


def withheld(chunks: Sequence[Any], kinds: Iterable[str], *, dp_size: int, expert_dp_size: int = 1) -> dict[str, str]:
    """Kind -> why it is not recorded, for the kinds asked for that this training would record wrong.

    ``dp_size``: the data-parallel replicas of the dense parameters (context parallel included);
    ``expert_dp_size``: of the experts' parameters."""
    overlapped = any(getattr(getattr(chunk, "ddp_config", None), "overlap_grad_reduce", False) for chunk in chunks)
    if "grad_local" in kinds and overlapped and max(dp_size, expert_dp_size) > 1:
        return {"grad_local": "overlap_grad_reduce: the data-parallel reductions start during the backward pass, "
                              "so by finalize_model_grads, where grad_local is read, part of each gradient is "
                              "already reduced; record without overlap_grad_reduce to have it"}
    return {}


def replicas() -> tuple[int, int]:
    """(dense, expert) data-parallel sizes of this training, context parallel included; (1, 1) before
    ``parallel_state`` is initialised."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 1, 1
    return ps.get_data_parallel_world_size(with_context_parallel=True), ps.get_expert_data_parallel_world_size()

"""What the recorder refuses in one line, and what it names missing, before it records a number
(``workbench/recorder/unrecordable.py``), for Megatron Core's own classes and configs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.distributed.torch_fully_sharded_data_parallel import TorchFullyShardedDataParallel
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from megatron.core.optimizer.optimizer import ChainedOptimizer, FP32Optimizer

from workbench.errors import ArgumentError
from workbench.recorder.recorder import Recorder
from workbench.recorder.unrecordable import refusal, withheld
from workbench.sites import SITE_KINDS

ALL_KINDS = tuple(SITE_KINDS)


def chunk(config: Any = None, **ddp: bool) -> SimpleNamespace:
    """A DDP-wrapped model chunk as the recorder sees it: its ``ddp_config`` and the model's ``config``."""
    model = torch.nn.Linear(2, 2)
    model.config = config  # type: ignore[assignment]
    return SimpleNamespace(ddp_config=DistributedDataParallelConfig(**ddp), module=model)


def bare(cls: type) -> Any:
    """An instance of one of Megatron's classes, not constructed (their constructors need CUDA tensors)."""
    return object.__new__(cls)


def test_a_plain_ddp_chunk_and_megatrons_fp32_optimizer_are_recordable() -> None:
    assert refusal([chunk()], bare(FP32Optimizer)) is None
    assert refusal([chunk(overlap_grad_reduce=True)], None) is None


def sharding(cls: type = DistributedOptimizer) -> Any:
    """Megatron's distributed optimizer as the recorder reads it: its shard map (empty here)."""
    optimizer = bare(cls)
    optimizer.model_param_gbuf_map = {}
    return optimizer


def chained(*parts: Any) -> Any:
    optimizer = bare(ChainedOptimizer)
    optimizer.chained_optimizers = list(parts)
    return optimizer


@pytest.mark.parametrize("optimizer", [
    sharding(),
    SimpleNamespace(wrapped=sharding()),  # under the runner's adapter
    chained(bare(FP32Optimizer), sharding()),  # Megatron's ChainedOptimizer (dense and expert parts)
], ids=["optimizer", "wrapped", "chained"])
def test_the_distributed_optimizer_is_recordable_when_record_is_handed_it(optimizer: Any) -> None:
    assert refusal([chunk(use_distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True)],
                   optimizer) is None


@pytest.mark.parametrize("optimizer", [None, bare(FP32Optimizer), torch.optim.Adam([torch.zeros(1)])],
                         ids=["none", "another", "torch"])
def test_the_distributed_optimizer_not_handed_to_record_is_refused_in_one_line(optimizer: Any) -> None:
    why = refusal([chunk(use_distributed_optimizer=True)], optimizer)  # the buffers reduce-scatter
    assert why is not None and "\n" not in why
    assert "needs the optimizer" in why and "(use_distributed_optimizer)" in why and "nothing was written" in why


def test_a_distributed_optimizer_without_megatrons_shard_map_is_refused() -> None:
    class LayerWiseDistributedOptimizer:  # shards by another rule: which part this rank reduced is not known
        pass

    why = refusal([chunk()], chained(bare(FP32Optimizer), LayerWiseDistributedOptimizer()))
    assert why is not None and "cannot record LayerWiseDistributedOptimizer" in why and "\n" not in why


@pytest.mark.parametrize("chunks, named", [
    ([chunk(use_megatron_fsdp=True)], "Megatron FSDP (use_megatron_fsdp)"),
    ([bare(TorchFullyShardedDataParallel)], "wrapped in TorchFullyShardedDataParallel"),
    ([chunk(SimpleNamespace(use_torch_fsdp2=True))], "torch FSDP2 (use_torch_fsdp2)"),
    ([chunk(SimpleNamespace(enable_cuda_graph=True))], "CUDA-graphed layers (enable_cuda_graph)"),
    ([chunk(SimpleNamespace(cuda_graph_impl="transformer_engine"))], "cuda_graph_impl='transformer_engine'"),
    ([chunk(SimpleNamespace(external_cuda_graph=True))], "(external_cuda_graph)"),
], ids=["megatron-fsdp", "torch-fsdp-wrapper", "torch-fsdp2", "cuda-graph", "cuda-graph-impl", "external-graph"])
def test_sharded_parameters_and_cuda_graphs_are_refused_naming_the_switch(chunks: list[Any], named: str) -> None:
    why = refusal(chunks)
    assert why is not None and named in why and "\n" not in why


def test_cuda_graph_impl_none_is_recordable() -> None:
    assert refusal([chunk(SimpleNamespace(cuda_graph_impl="none", enable_cuda_graph=False))]) is None


def test_grad_local_is_named_missing_under_overlapped_reduction_across_replicas() -> None:
    overlapped = [chunk(overlap_grad_reduce=True)]
    why = withheld(overlapped, ALL_KINDS, dp_size=2)
    assert list(why) == ["grad_local"] and "overlap_grad_reduce" in why["grad_local"]
    assert list(withheld(overlapped, ALL_KINDS, dp_size=1, expert_dp_size=2)) == ["grad_local"]  # experts' replicas


@pytest.mark.parametrize("chunks, kinds, dp_size", [
    ([chunk(overlap_grad_reduce=True)], ALL_KINDS, 1),  # one replica: nothing is reduced over data parallel
    ([chunk()], ALL_KINDS, 2),  # reduced in finalize_model_grads, after grad_local is read
    ([chunk(overlap_grad_reduce=True)], tuple(k for k in ALL_KINDS if k != "grad_local"), 2),  # not asked for
], ids=["one-replica", "not-overlapped", "not-asked"])
def test_grad_local_is_recorded_where_it_is_read_before_any_reduction(chunks: list[Any], kinds: tuple[str, ...],
                                                                      dp_size: int) -> None:
    assert withheld(chunks, kinds, dp_size=dp_size) == {}


def test_the_recorder_refuses_before_it_hooks_anything(tmp_path: Any) -> None:
    model = torch.nn.Linear(2, 2)
    wrapped = SimpleNamespace(ddp_config=DistributedDataParallelConfig(use_distributed_optimizer=True), module=model)
    with pytest.raises(ArgumentError, match="needs the optimizer under Megatron's distributed optimizer"):
        Recorder([wrapped], run_dir=tmp_path / "run", total_steps=2)  # type: ignore[list-item]
    assert not model._forward_hooks and not model._forward_pre_hooks and not (tmp_path / "run").exists()


def test_snapshots_of_parameter_sites_read_in_shards_are_refused_naming_the_first() -> None:
    from workbench.recorder.placement import whole
    from workbench.recorder.targets import ParameterTarget
    from workbench.recorder.unrecordable import sharded_snapshots
    from workbench.sites import site_matcher

    param = torch.nn.Parameter(torch.zeros(4, 3))
    sharded = [ParameterTarget("layers.0.mlp.linear_fc1.weight", param, whole((4, 3)), (slice(1, 3), slice(0, 3)),
                               (0, 6))]
    kinds = {"param", "grad", "act"}
    why = sharded_snapshots(sharded, kinds, site_matcher(("*",)))
    assert why is not None and "\n" not in why and why.endswith("nothing was written")
    assert "(grad:layers.0.mlp.linear_fc1.weight and 1 more)" in why
    assert sharded_snapshots(sharded, kinds, site_matcher(("act:*",))) is None  # activations only: recordable
    unsharded = [ParameterTarget("layers.0.mlp.linear_fc1.weight", param, whole((4, 3)))]
    assert sharded_snapshots(unsharded, kinds, site_matcher(("*",))) is None

"""The sites of a Mixture-of-Experts layer (Megatron's ``MoELayer``), layout-independent like every other.

For a MoE layer ``layers.L.mlp`` the recorder adds, beside the layer's output ``act:layers.L.mlp``:

    act:layers.L.mlp.router             routing probabilities [samples, seq, experts] (0 where not chosen)
    act:layers.L.mlp.tokens_per_expert  tokens routed to each expert, per micro-batch [micro-batches, experts]
    act:layers.L.mlp.experts.E          expert E's output per token [samples, seq, hidden] (0 where not routed)
    loss:layers.L.mlp.aux_loss          the load-balancing loss (unweighted), per micro-batch [micro-batches]

An expert's output is computed on the rank that holds the expert, for the tokens gathered
from every rank of its expert-parallel group (the ``allgather`` dispatcher); each token's row
is put back at its own (sample, position), so expert 5 of an EP=2 run and of the EP=1 run
are the same tensor, element by element. Only the statistics of micro-batch-sized pieces
are added per step, as for every site. With sequence parallelism each TP rank routes its
share of the sequence: the probabilities and expert outputs are placed at their positions,
the counts and the aux loss (partial sums) are summed over the TP group first. Expert
outputs split over an expert-tensor-parallel group (partial sums) are not recorded.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from workbench.recorder.placement import Placement, activation_placement
from workbench.recorder.targets import site_names, unwrap

Record = Callable[[str, str, torch.Tensor, Placement], None]


@dataclass(frozen=True)
class MoELayerSites:
    name: str
    """Canonical name of the layer's MLP, ``layers.L.mlp``."""
    module: Any
    """Megatron's ``MoELayer`` (its router, experts and token dispatcher)."""
    first_expert: int


def moe_layers(chunks: list[torch.nn.Module]) -> list[MoELayerSites]:
    """The MoE layers of a rank's model chunks: modules with a router, experts and a token dispatcher."""
    found = []
    for chunk in chunks:
        model = unwrap(chunk)
        name = site_names(model)
        for local_name, module in model.named_modules():
            if local_name and all(hasattr(module, a) for a in ("router", "experts", "token_dispatcher",
                                                               "local_expert_indices")):
                found.append(MoELayerSites(name(local_name), module,
                                           int(module.local_expert_indices[0])))
    return found


def micro_batch_placement(shape: tuple[int, ...], *, sample_offset: int, global_batch: int, micro_batch: int,
                          tp_rank: int) -> Placement:
    """A per-micro-batch value of ``shape`` (a count per expert, a scalar loss), held as [1, *shape], as row
    ``sample_offset // micro_batch`` of [micro-batches of the global batch, *shape]; TP rank 0 counts it."""
    micro_batch = max(micro_batch, 1)
    return Placement(full_shape=(max(1, global_batch // micro_batch), *shape), dims=tuple(range(1 + len(shape))),
                     offsets=(sample_offset // micro_batch, *(0 for _ in shape)), contributes=tp_rank == 0)


class MoEHooks:
    """Hooks on one rank's MoE layers that hand their sites to ``record``; ``remove`` takes them off.

    ``offset()`` is the global index of the current micro-batch's first sample, ``global_batch()`` the
    samples per step, ``wanted(kind)`` whether a kind is recorded, ``active()`` whether this step is.
    """

    def __init__(self, layers: list[MoELayerSites], *, record: Record, offset: Callable[[], int],
                 seq_shard: Callable[[int], tuple[int, int] | None], global_batch: Callable[[int], int],
                 wanted: Callable[[str], bool], active: Callable[[], bool], tp_rank: int,
                 expert_tp_size: int) -> None:
        self._record, self._offset, self._seq_shard, self._global_batch = record, offset, seq_shard, global_batch
        self._wanted, self._active, self._tp_rank = wanted, active, tp_rank
        self._handles: list[Any] = []
        self._undo: list[Callable[[], None]] = []
        self._micro_batch = 1
        """Samples of the micro-batch a router last saw (the aux loss is computed without them)."""
        self._sequence_shared = False
        """Whether that micro-batch's sequence is split over the TP ranks (sequence parallelism)."""
        for layer in layers:
            self._handles.append(layer.module.router.register_forward_pre_hook(self._on_router_input))
            self._handles.append(layer.module.router.register_forward_hook(
                lambda m, args, out, layer=layer: self._on_router(layer, args, out)))
            if expert_tp_size == 1:  # with expert TP > 1 each rank holds partial sums of an expert's output
                self._handles.append(layer.module.experts.register_forward_hook(
                    lambda m, args, out, layer=layer: self._on_experts(layer, out)))
            self._wrap_aux_loss(layer)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        for undo in self._undo:
            undo()
        self._handles, self._undo = [], []

    def _on_router(self, layer: MoELayerSites, args: Any, output: Any) -> None:
        hidden = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if not self._active() or hidden is None or hidden.ndim != 3 or not isinstance(output, tuple):
            return
        probs, routing_map = output[0], output[1]
        seq, batch = hidden.shape[0], hidden.shape[1]
        offset, global_batch, shard = self._offset(), self._global_batch(batch), self._seq_shard(seq)
        if self._wanted("act"):
            probs = probs.reshape(seq, batch, -1)
            self._record("act", f"{layer.name}.router", probs, activation_placement(
                tuple(probs.shape), sample_offset=offset, global_batch=global_batch, feature_shard=None,
                tp_rank=self._tp_rank, seq_shard=shard))
            counts = routing_map.reshape(seq * batch, -1).sum(dim=0, dtype=torch.float32).unsqueeze(0)
            if shard is not None:  # each TP rank routed its share of the sequence: the micro-batch's counts
                counts = _tp_sum(counts)
            self._record("act", f"{layer.name}.tokens_per_expert", counts, micro_batch_placement(
                tuple(counts.shape[1:]), sample_offset=offset, global_batch=global_batch, micro_batch=batch,
                tp_rank=self._tp_rank))

    def _wrap_aux_loss(self, layer: MoELayerSites) -> None:
        router = layer.module.router
        original = getattr(router, "attach_and_log_load_balancing_loss", None)
        if original is None:
            return

        def attach(router_self: Any, activation: torch.Tensor, aux_loss_coeff: float, aux_loss: torch.Tensor,
                   *args: Any, **kwargs: Any) -> Any:
            if self._active() and self._wanted("loss") and aux_loss_coeff:
                batch = self._micro_batch
                value = (aux_loss.detach().float() / aux_loss_coeff).reshape(1)
                if self._sequence_shared:  # each TP rank's term covers its share of the sequence
                    value = _tp_sum(value)
                self._record("loss", f"{layer.name}.aux_loss", value, micro_batch_placement(
                    (), sample_offset=self._offset(), global_batch=self._global_batch(batch), micro_batch=batch,
                    tp_rank=self._tp_rank))
            return original(activation, aux_loss_coeff, aux_loss, *args, **kwargs)

        router.attach_and_log_load_balancing_loss = types.MethodType(attach, router)
        self._undo.append(lambda: delattr(router, "attach_and_log_load_balancing_loss"))

    def _on_router_input(self, module: torch.nn.Module, args: Any) -> None:
        hidden = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if hidden is not None and hidden.ndim == 3:
            self._micro_batch = int(hidden.shape[1])
            self._sequence_shared = self._seq_shard(int(hidden.shape[0])) is not None

    def _on_experts(self, layer: MoELayerSites, output: Any) -> None:
        if not self._active() or not self._wanted("act"):
            return
        dispatcher = layer.module.token_dispatcher
        local_map = getattr(dispatcher, "local_map", None)
        shape = getattr(dispatcher, "hidden_shape", None)
        values = output[0] if isinstance(output, tuple) else output
        if local_map is None or shape is None or not isinstance(values, torch.Tensor):
            return
        seq, batch, hidden = int(shape[0]), int(shape[1]), int(shape[-1])
        per_rank = seq * batch
        shard = self._seq_shard(seq)
        peers = self._peers(dispatcher, values.device, -1 if shard is None else shard[0])
        global_batch = self._global_batch(batch)
        start = 0
        for k in range(local_map.shape[1]):
            tokens = local_map[:, k].nonzero().squeeze(1)
            rows = values[start:start + tokens.numel()].detach()
            start += tokens.numel()
            for peer, (peer_offset, peer_tp) in enumerate(peers):
                mine = (tokens >= peer * per_rank) & (tokens < (peer + 1) * per_rank)
                local = tokens[mine] - peer * per_rank
                full = torch.zeros(per_rank, hidden, dtype=values.dtype, device=values.device)
                full[local] = rows[mine]
                full = full.view(seq, batch, hidden)
                self._record("act", f"{layer.name}.experts.{layer.first_expert + k}", full, activation_placement(
                    tuple(full.shape), sample_offset=peer_offset, global_batch=global_batch, feature_shard=None,
                    tp_rank=self._tp_rank, seq_shard=None if shard is None else (peer_tp, shard[1])))

    def _peers(self, dispatcher: Any, device: torch.device, tp_rank: int) -> list[tuple[int, int]]:
        """(first sample of the current micro-batch, TP rank: its share of the sequence) of each rank of the
        dispatcher's gather, in its order."""
        group = getattr(dispatcher, "tp_ep_group", None)
        size = dist.get_world_size(group) if group is not None and dist.is_initialized() else 1
        if size == 1:
            return [(self._offset(), tp_rank)]
        mine = torch.tensor([self._offset(), tp_rank], dtype=torch.int64, device=device)
        gathered = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(gathered, mine, group=group)
        return [(int(t[0]), int(t[1])) for t in gathered]


def _tp_sum(value: torch.Tensor) -> torch.Tensor:
    """``value`` summed over this rank's tensor-parallel group."""
    from megatron.core import parallel_state as ps

    total = value.clone()
    dist.all_reduce(total, group=ps.get_tensor_model_parallel_group())
    return total

"""The per-micro-batch sites: activations, their gradients, the per-token loss and a MoE layer's sites.

Each is recorded from a hook (``workbench.recorder.hooks``) as it is computed, and placed by
the global index of its micro-batch's first sample: declared by the loop
(``Recorder.microbatch``) or, where nothing is declared, taken as each data-parallel rank
holding consecutive, equal shares of the global batch. A sequence-parallel activation is its
tensor-parallel rank's share of the sequence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from workbench.recorder.hooks import StepHooks, Undo
from workbench.recorder.moe import MoEHooks, moe_layers
from workbench.recorder.placement import activation_placement, token_placement
from workbench.recorder.slots import Slot, Slots, Stopwatch
from workbench.recorder.targets import ParallelRanks, first_tensor, unwrap

OnGradient = Callable[[torch.Tensor], None]


class ActivationSide:
    def __init__(self, chunks: Sequence[torch.nn.Module], *, slots: Slots, ranks: ParallelRanks, kinds: set[str],
                 global_batch: int, clock: Stopwatch) -> None:
        self._slots, self._ranks, self._kinds, self._clock = slots, ranks, kinds, clock
        self._global_batch = global_batch
        self._entries: dict[tuple[Any, ...], tuple[Slot | None, OnGradient | None]] = {}
        """Per activation module, micro-batch offset, shape and sequence length: its act slot and its
        gradient's hook."""
        self._seq_length = 0
        self._sequence_parallel = any(getattr(getattr(m, "config", None), "sequence_parallel", False)
                                      for c in chunks for m in (c, unwrap(c)))
        self._offset = 0
        self._explicit_offset: int | None = None
        self._samples_seen = 0
        layers = moe_layers(list(chunks)) if kinds & {"act", "loss"} else []
        self.hooks = StepHooks(chunks, activations=bool(kinds & {"act", "act_grad"}), loss="loss" in kinds,
                               on_microbatch_start=self._on_microbatch_start,
                               on_activation=clock.timed(self._on_activation),
                               on_model_output=clock.timed(self._on_model_output),
                               extra=(lambda: self._moe_hooks(layers)) if layers else None)

    def begin(self) -> None:
        """A step begins: no sample seen yet, no offset declared."""
        self._samples_seen = 0
        self._explicit_offset = None

    def declare(self, sample_offset: int) -> None:
        """The global index of the first sample of the micro-batch about to run: its place in the step's global
        batch, or a running sample counter, taken modulo the global batch (each step reads one global batch), so
        that a loop counting samples across steps places them as one counting from 0 each step, and the sites'
        slots do not grow with every step."""
        self._explicit_offset = sample_offset % self._global_batch if self._global_batch else sample_offset

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Forward passes within the step that are not recorded leave the micro-batch count as it was."""
        saved = self._offset, self._samples_seen, self._explicit_offset
        try:
            yield
        finally:
            self._offset, self._samples_seen, self._explicit_offset = saved

    def _moe_hooks(self, layers: list[Any]) -> Undo:
        hooks = MoEHooks(layers, record=self._clock.timed(self._slots.record), offset=lambda: self._offset,
                         seq_shard=self._seq_shard, global_batch=lambda batch: self._global_batch or batch,
                         wanted=lambda kind: kind in self._kinds, active=lambda: self._slots.state is not None,
                         tp_rank=self._ranks.tp_rank, expert_tp_size=self._ranks.expert_tp_size)
        return hooks.remove

    def _on_microbatch_start(self, module: torch.nn.Module, args: Any) -> None:
        tokens = next((a for a in args if isinstance(a, torch.Tensor) and a.ndim >= 2), None)
        batch = 0 if tokens is None else tokens.shape[0]
        if tokens is not None:  # [batch, seq]: a sequence-parallel activation holds seq / TP positions of it
            self._seq_length = int(tokens.shape[1])
        if self._explicit_offset is not None:
            self._offset, self._explicit_offset = self._explicit_offset, None
        else:  # nothing declared: DP ranks hold consecutive, equal shares of the global batch
            share = self._global_batch // self._ranks.dp_size
            self._offset = self._ranks.dp_rank * share + self._samples_seen
        self._samples_seen += batch

    def _on_activation(self, name: str, output: Any, sharded: bool) -> None:
        tensor = output if isinstance(output, torch.Tensor) else first_tensor(output)
        if self._slots.state is None or tensor is None or tensor.ndim < 2:
            return
        # hundreds of calls a step, each on a tensor just computed: one lookup, then the kernel
        key = (name, self._offset, tensor.shape, self._seq_length)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = self._entry(name, tensor, sharded)
        act, on_gradient = entry
        if act is not None and act.site is not None:
            self._slots.accumulate(act, tensor)
        if on_gradient is not None and tensor.requires_grad:
            node = tensor.grad_fn
            if node is None:
                tensor.register_hook(on_gradient)
            else:  # a pre-hook on the node that made it sees the same gradient, at a third of the cost
                index = tensor.output_nr
                node.register_prehook(lambda grads: on_gradient(grads[index]))

    def _entry(self, name: str, tensor: torch.Tensor, sharded: bool) -> tuple[Slot | None, OnGradient | None]:
        ranks, slots = self._ranks, self._slots
        placement = activation_placement(
            tuple(tensor.shape), sample_offset=self._offset, global_batch=self._global_batch or tensor.shape[1],
            feature_shard=(ranks.tp_rank, ranks.tp_size) if sharded else None,
            tp_rank=ranks.tp_rank, seq_shard=self._seq_shard(tensor.shape[0]))
        act = slots.slot("act", name, placement, tensor) if "act" in self._kinds else None
        if "act_grad" not in self._kinds:
            return act, None

        def on_gradient(grad: torch.Tensor) -> None:
            if slots.state is None:
                return
            slot = slots.slot("act_grad", name, placement, grad)  # one dict lookup after the first
            if slot.site is not None:
                # Each DP rank differentiates the mean loss of its own share of the batch: scaled
                # by 1/dp this is the gradient of the global-batch loss, the same for every layout
                # (exactly so for power-of-two DP sizes).
                slots.accumulate(slot, grad, divisor=ranks.dp_size)

        return act, self._clock.timed(on_gradient)

    def _seq_shard(self, length: int) -> tuple[int, int] | None:
        """(TP rank, TP size) when an activation of ``length`` positions is this rank's share of the sequence."""
        tp = self._ranks.tp_size
        if self._sequence_parallel and tp > 1 and length * tp == self._seq_length:
            return self._ranks.tp_rank, tp
        return None

    def _on_model_output(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        tensor = first_tensor(output)
        if self._slots.state is None or tensor is None or tensor.ndim != 2 or not tensor.is_floating_point():
            return
        placement = token_placement(tuple(tensor.shape), sample_offset=self._offset,
                                    global_batch=self._global_batch or tensor.shape[0], tp_rank=self._ranks.tp_rank)
        self._slots.record("loss", "cross_entropy", tensor, placement)

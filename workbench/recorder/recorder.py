"""The recorder: per-site statistics and fingerprints from any Megatron Core model, into the run store.

Attach it to model chunks (DDP-wrapped or not) and an optimizer; call ``step_begin`` and
``step_end`` around each step (and ``microbatch`` in the forward step, so activations
are keyed by their global sample index); ``close`` removes every hook.

    recorder = Recorder([ddp_model], optimizer=optimizer, run_dir=run_dir, total_steps=steps)
    for step in range(steps):
        recorder.step_begin(step)
        losses = forward_backward(...)        # forward_step calls recorder.microbatch(first_sample)
        optimizer.step()
        recorder.step_end(step)
    recorder.close()

It never blocks training on I/O: statistics stay on the device, accumulate over
micro-batches, are reduced over ranks once per flush (one all-reduce of a few numbers
per site; never a gather of tensors), copied to the host once, and written by a
background thread on global rank 0. Snapshots are written by the rank that holds each
piece, into its own chunk. A step that is not recorded runs without module hooks
(``workbench.recorder.hooks``).

Where the parts live: which sites exist and in what order (``registry``), the accumulators of
a step and their reduction over ranks (``step_state``), snapshots (``snapshots``), the hooks
(``hooks``), the statistics pass itself (``kernels``).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from workbench.config import RecordConfig
from workbench.recorder import kernels
from workbench.recorder.hooks import StepHooks, Undo, hook_optimizer_step, wrap_finalize
from workbench.recorder.moe import MoEHooks, moe_layers
from workbench.recorder.placement import Placement, activation_placement, token_placement
from workbench.recorder.registry import SiteRegistry
from workbench.recorder.snapshots import snapshot_of, write_snapshots
from workbench.recorder.step_state import PendingStep, StepState, reduce_pending
from workbench.recorder.targets import (
    ParallelRanks,
    adam_moments,
    all_gather_objects,
    first_tensor,
    parameter_targets,
    unwrap,
)
from workbench.sites import SiteFilter, site_id, site_matcher
from workbench.statistics import PRECISION_LIMITS
from workbench.store.writer import BackgroundWriter, contiguous_ranges, write_site_rows


def _timed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds the wall time of a recorder method to the recorder's time for the step.

    The recorder's own torch calls skip torch-function modes: a mode in Python (the CPU
    runner's device mapping) costs microseconds per call, and the recorder makes thousands
    a step, none of which a mode should change.
    """
    def wrapper(self: Recorder, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            with torch._C.DisableTorchFunction():
                return fn(self, *args, **kwargs)
        finally:
            self._seconds += time.perf_counter() - start
    return wrapper


@dataclass(frozen=True)
class _Slot:
    """Where one tensor of a site goes: its site (None where it is not recorded: filtered out, or a
    replica that another rank counts), its placement and the kernel's coords for it."""

    kind: str
    name: str
    site: str | None
    placement: Placement
    coords: torch.Tensor
    device: torch.device
    native: bool
    """Whether the native kernel takes the site's tensors (on the CPU, unless the eager path was asked for)."""


class Recorder:
    def __init__(self, chunks: Sequence[torch.nn.Module], *, run_dir: str | Path, total_steps: int,
                 optimizer: Any = None, record: RecordConfig | None = None, precision: str = "fp32",
                 global_batch_size: int | None = None, flush_every: int = 10,
                 sites: SiteFilter | None = None) -> None:
        self.record = record or RecordConfig()
        self._chunks = list(chunks)
        self._optimizer = optimizer
        self._run_dir = Path(run_dir)
        self._ranks = ParallelRanks.current()
        self._rank = dist.get_rank() if dist.is_initialized() else 0
        self._global_batch = global_batch_size or 0
        self._flush_every = flush_every
        self._wanted = site_matcher(sites if sites is not None else self.record.sites)
        self._snapshot_wanted = site_matcher(self.record.snapshot_sites)
        self._kinds = set(self.record.kinds)
        self._fused = self.record.compile
        self._tiny, self._largest = PRECISION_LIMITS[precision]
        self._rows = {step: row for row, step in enumerate(self.record.recorded_steps(total_steps))}
        self._params = parameter_targets(self._chunks, self._ranks)
        self._device = self._params[0].param.device if self._params else torch.device("cpu")
        self._registry = SiteRegistry(self._wanted, self._ranks)
        self._slots: dict[tuple[str, str, Placement], _Slot] = {}
        self._activations: dict[tuple[Any, ...], tuple[_Slot | None, Callable[[torch.Tensor], None] | None]] = {}
        """Per activation module, micro-batch offset and shape: its act slot and its gradient's hook."""
        self._seq_length = 0
        self._sequence_parallel = any(getattr(getattr(m, "config", None), "sequence_parallel", False)
                                      for c in self._chunks for m in (c, unwrap(c)))
        self._before: dict[str, torch.Tensor] = {}
        """Each ``update`` site's parameter as the step began (buffers reused at every recorded step)."""
        self._pending: list[PendingStep] = []
        self._state: StepState | None = None
        self._step = -1
        self._snapshotting = False
        """Whether the current step takes snapshots."""
        self._offset = 0
        self._explicit_offset: int | None = None
        self._samples_seen = 0
        self._seconds = 0.0
        self._writer: BackgroundWriter | None = None
        self._undo: list[Undo] = []
        """What ``close`` undoes: wrapped config functions and optimizer steps."""
        # Reduced gradients are read when the optimizer step begins; without an optimizer, after
        # config.finalize_model_grads_func.
        hooked = None if optimizer is None else hook_optimizer_step(optimizer, self._on_gradients_reduced)
        if hooked is not None:
            self._undo.append(hooked)
        self._undo += wrap_finalize(self._chunks, self._before_reduction,
                                    self._on_gradients_reduced if hooked is None else None)
        layers = moe_layers(self._chunks) if self._kinds & {"act", "loss"} else []
        self._hooks = StepHooks(self._chunks, activations=bool(self._kinds & {"act", "act_grad"}),
                                loss="loss" in self._kinds, on_microbatch_start=self._on_microbatch_start,
                                on_activation=self._on_activation, on_model_output=self._on_model_output,
                                extra=(lambda: self._moe_hooks(layers)) if layers else None)

    def parameter_count(self) -> int:
        """Parameters of the full model, each counted once (collective: it gathers the names every
        pipeline stage and tensor-parallel rank holds, with their full shapes)."""
        local = {t.name: int(np.prod(t.placement.full_shape, dtype=np.int64)) for t in self._params}
        merged: dict[str, int] = {}
        for part in all_gather_objects(local):
            merged.update(part)
        return sum(merged.values())

    # -- the step ------------------------------------------------------------------------

    @_timed
    def step_begin(self, step: int) -> None:
        """Start step ``step``: records parameters as the forward will see them."""
        self._step = step
        self._samples_seen = 0
        self._explicit_offset = None
        self._state = StepState() if step in self._rows else None
        if self._state is None:
            return
        self._snapshotting = step in self.record.snapshot_steps
        self._hooks.attach()
        copies, plain = [], []
        for target in self._params:
            before = None
            if "update" in self._kinds and target.placement.contributes and \
                    self._wanted(site_id("update", target.name)):
                # One buffer per parameter, kept between recorded steps: a copy into it costs a
                # third of a fresh clone (no allocation, no page faults).
                before = self._before.get(target.name)
                if before is None:
                    before = self._before[target.name] = torch.empty_like(target.param, requires_grad=False)
                self._state.before[target.name] = before
            slot = self._slot("param", target.name, target.placement, target.param) \
                if "param" in self._kinds else None
            param = target.param.detach()
            if slot is not None and slot.site is not None:
                self._snapshot(slot, param)
                acc = self._state.accumulator(slot.site, param.device)
                if before is not None:  # the parameter's statistics and its copy in one read
                    copies.append((param, before, slot.coords, acc.acc, acc.lanes))
                else:
                    plain.append((param, slot.coords, acc.acc, acc.lanes))
            elif before is not None:
                before.copy_(param)
        kernels.accumulate_copies(copies, self._tiny, self._largest, fused=self._fused)
        kernels.accumulate_many(plain, self._tiny, self._largest, fused=self._fused)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Within a step, run forward passes that are not recorded (a validation loss, say)."""
        saved = self._state, self._offset, self._samples_seen, self._explicit_offset
        self._state = None
        try:
            yield
        finally:
            self._state, self._offset, self._samples_seen, self._explicit_offset = saved

    def step_end(self, step: int) -> float:
        """Finish step ``step`` (after the optimizer step); return the recorder's seconds for it."""
        start = time.perf_counter()
        state = self._state
        if state is not None:
            with torch._C.DisableTorchFunction():
                self._record_optimizer(state)
            self._state = None
            self._finish(step, state)
            if step + 1 not in self._rows:  # the next step runs without module hooks
                self._hooks.remove()
        seconds = self._seconds + time.perf_counter() - start
        self._seconds = 0.0
        return seconds

    def microbatch(self, sample_offset: int) -> None:
        """Declare the global index of the first sample of the micro-batch about to run."""
        self._explicit_offset = sample_offset

    # -- hooks ---------------------------------------------------------------------------

    def _moe_hooks(self, layers: list[Any]) -> Undo:
        hooks = MoEHooks(layers, record=self._record_timed, offset=lambda: self._offset, seq_shard=self._seq_shard,
                         global_batch=lambda batch: self._global_batch or batch,
                         wanted=lambda kind: kind in self._kinds, active=lambda: self._state is not None,
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

    @_timed
    def _on_activation(self, name: str, output: Any, sharded: bool) -> None:
        tensor = output if isinstance(output, torch.Tensor) else first_tensor(output)
        if self._state is None or tensor is None or tensor.ndim < 2:
            return
        # hundreds of calls a step, each on a tensor just computed: one lookup, then the kernel
        key = (name, self._offset, tensor.shape, self._seq_length)
        entry = self._activations.get(key)
        if entry is None:
            entry = self._activations[key] = self._activation_entry(name, tensor, sharded)
        act, on_gradient = entry
        if act is not None and act.site is not None:
            self._accumulate(act, tensor)
        if on_gradient is not None and tensor.requires_grad:
            node = tensor.grad_fn
            if node is None:
                tensor.register_hook(on_gradient)
            else:  # a pre-hook on the node that made it sees the same gradient, at a third of the cost
                index = tensor.output_nr
                node.register_prehook(lambda grads: on_gradient(grads[index]))

    def _activation_entry(self, name: str, tensor: torch.Tensor,
                          sharded: bool) -> tuple[_Slot | None, Callable[[torch.Tensor], None] | None]:
        placement = activation_placement(
            tuple(tensor.shape), sample_offset=self._offset, global_batch=self._global_batch or tensor.shape[1],
            feature_shard=(self._ranks.tp_rank, self._ranks.tp_size) if sharded else None,
            tp_rank=self._ranks.tp_rank, seq_shard=self._seq_shard(tensor.shape[0]))
        act = self._slot("act", name, placement, tensor) if "act" in self._kinds else None
        if "act_grad" not in self._kinds:
            return act, None

        @_timed
        def on_gradient(recorder: Recorder, grad: torch.Tensor) -> None:
            if recorder._state is None:
                return
            slot = recorder._slot("act_grad", name, placement, grad)
            if slot.site is not None:
                # Each DP rank differentiates the mean loss of its own share of the batch: scaled
                # by 1/dp this is the gradient of the global-batch loss, the same for every layout
                # (exactly so for power-of-two DP sizes).
                recorder._accumulate(slot, grad / recorder._ranks.dp_size if recorder._ranks.dp_size > 1 else grad)

        return act, lambda grad: on_gradient(self, grad)

    def _seq_shard(self, length: int) -> tuple[int, int] | None:
        """(TP rank, TP size) when an activation of ``length`` positions is this rank's share of the sequence."""
        tp = self._ranks.tp_size
        if self._sequence_parallel and tp > 1 and length * tp == self._seq_length:
            return self._ranks.tp_rank, tp
        return None

    @_timed
    def _on_model_output(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        tensor = first_tensor(output)
        if self._state is None or tensor is None or tensor.ndim != 2 or not tensor.is_floating_point():
            return
        placement = token_placement(tuple(tensor.shape), sample_offset=self._offset,
                                    global_batch=self._global_batch or tensor.shape[0], tp_rank=self._ranks.tp_rank)
        self._record("loss", "cross_entropy", tensor, placement)

    def _before_reduction(self) -> None:
        if self._state is not None and "grad_local" in self._kinds:
            self._record_gradients("grad_local")

    def _on_gradients_reduced(self) -> None:
        state = self._state
        if state is not None and "grad" in self._kinds and not state.grads_recorded:
            state.grads_recorded = True  # once per step, however many optimizers step
            self._record_gradients("grad")

    @_timed
    def _record_gradients(self, kind: str) -> None:
        entries = []
        for target in self._params:
            # Megatron DDP's main_grad is a view into the contiguous grad buffer: the batch below
            # reads the buffer's segments in one native call.
            grad = getattr(target.param, "main_grad", None)
            grad = target.param.grad if grad is None else grad
            if grad is not None:  # grad_local: each DP rank holds its own partial sum; DP rank 0's counts
                entries.append((kind, target.name, grad, target.placement))
        self._record_many(entries)

    def _record_optimizer(self, state: StepState) -> None:
        if self._optimizer is not None and self._kinds & {"exp_avg", "exp_avg_sq"}:
            moments = list(adam_moments(self._optimizer, self._params))
            # both moments in one pass, every first moment registered before the second ones
            self._record_many([("exp_avg", t.name, avg, t.placement) for t, avg, _ in moments
                               if "exp_avg" in self._kinds]
                              + [("exp_avg_sq", t.name, avg_sq, t.placement) for t, _, avg_sq in moments
                                 if "exp_avg_sq" in self._kinds])
        if "update" in self._kinds:
            self._record_updates(state)

    def _record_updates(self, state: StepState) -> None:
        """The ``update`` sites: each parameter minus its copy from the start of the step, taken element by
        element inside the statistics pass (materialised only for a snapshot)."""
        differences, materialised = [], []
        for target in self._params:
            slot = self._slot("update", target.name, target.placement, target.param, torch.float32)  # in order
            before = state.before.get(target.name)
            if before is None or slot.site is None:
                continue
            acc = state.accumulator(slot.site, target.param.device)
            after = target.param.detach()
            if self._snapshot_due(slot.site):
                update = after.float() - before.float()
                self._snapshot(slot, update)
                materialised.append((update, slot.coords, acc.acc, acc.lanes))
            else:
                differences.append((after, before, slot.coords, acc.acc, acc.lanes))
        kernels.accumulate_differences(differences, self._tiny, self._largest, fused=self._fused)
        kernels.accumulate_many(materialised, self._tiny, self._largest, fused=self._fused)

    # -- recording ----------------------------------------------------------------------

    def _slot(self, kind: str, name: str, placement: Placement, tensor: torch.Tensor,
              dtype: torch.dtype | None = None) -> _Slot:
        """The slot of ``name``'s ``kind`` site at ``placement`` (registering the site on first sight)."""
        slot = self._slots.get((kind, name, placement))
        if slot is None:
            site = self._registry.register(kind, name, placement.full_shape,
                                           str(dtype or tensor.dtype).removeprefix("torch."))
            recorded = site is not None and placement.contributes
            slot = self._slots[(kind, name, placement)] = _Slot(
                kind, name, site if recorded else None, placement, placement.coords(tensor.device), tensor.device,
                self._fused and tensor.device.type == "cpu")
        return slot

    def _accumulate(self, slot: _Slot, tensor: torch.Tensor) -> None:
        """Add one tensor of a recorded slot into this step's accumulators (and snapshot it if due)."""
        assert self._state is not None and slot.site is not None
        acc = self._state.accumulator(slot.site, slot.device)
        if self._snapshotting:
            self._snapshot(slot, tensor)
        if slot.native:  # hundreds of calls a step: straight to the kernel
            kernels.native().accumulate(tensor if tensor.is_contiguous() else tensor.contiguous(), slot.coords,
                                        self._tiny, self._largest, acc.acc, acc.lanes)
        else:
            kernels.accumulate(tensor, slot.coords, self._tiny, self._largest, acc.acc, acc.lanes, fused=self._fused)

    def _record(self, kind: str, name: str, tensor: torch.Tensor, placement: Placement) -> None:
        slot = self._slot(kind, name, placement, tensor)
        if slot.site is not None:
            self._accumulate(slot, tensor)

    @_timed
    def _record_timed(self, kind: str, name: str, tensor: torch.Tensor, placement: Placement) -> None:
        self._record(kind, name, tensor, placement)

    def _record_many(self, entries: list[tuple[str, str, torch.Tensor, Placement]]) -> None:
        """Record each (kind, name, tensor, placement): the statistics of all of them in one kernel call."""
        assert self._state is not None
        items = []
        for kind, name, tensor, placement in entries:
            slot = self._slot(kind, name, placement, tensor)
            if slot.site is not None:
                acc = self._state.accumulator(slot.site, tensor.device)
                self._snapshot(slot, tensor)
                items.append((tensor, slot.coords, acc.acc, acc.lanes))
        kernels.accumulate_many(items, self._tiny, self._largest, fused=self._fused)

    def _snapshot_due(self, site: str) -> bool:
        return self._snapshotting and self._snapshot_wanted(site)

    def _snapshot(self, slot: _Slot, tensor: torch.Tensor) -> None:
        """Keep a host copy of ``tensor`` for the store if this step snapshots its site."""
        if slot.site is not None and self._snapshot_due(slot.site):
            assert self._state is not None
            self._state.snapshots.append(snapshot_of(self._step, slot.kind, slot.name, tensor, slot.placement))

    # -- the end of a step, flush (collective: every rank calls them at the same steps) ------

    def _finish(self, step: int, state: StepState) -> None:
        if self._registry.sites is None:
            self._registry.build(self._run_dir, rank=self._rank, steps=sorted(self._rows), kinds=self.record.kinds,
                                 optimizer_passed=self._optimizer is not None)
        self._pending.append(state.pending(self._rows[step], self._device))
        if step in self.record.snapshot_steps:
            write_snapshots(self._run_dir, state.snapshots, rank=self._rank, submit=self._background().submit)
        if len(self._pending) >= self._flush_every or self._rows[step] == len(self._rows) - 1:
            self.flush()

    def flush(self) -> None:
        """Reduce the pending steps over all ranks and hand them to the writer (global rank 0)."""
        if not self._pending or self._registry.sites is None:
            return
        start = time.perf_counter()
        reduced = reduce_pending(self._pending, self._registry.index, self._device, rank=self._rank)
        self._pending = []
        if reduced is not None:
            rows, stats, fingerprints = reduced
            position = 0
            for first, stop in contiguous_ranges(rows):
                block = slice(position, position + stop - first)
                position += stop - first
                self._background().submit(functools.partial(write_site_rows, self._run_dir, first, stats[block],
                                                            fingerprints[block]))
        self._seconds += time.perf_counter() - start

    def _background(self) -> BackgroundWriter:
        if self._writer is None:
            self._writer = BackgroundWriter()
        return self._writer

    def close(self, *, flush: bool = True) -> None:
        """Flush what is pending, wait for the writer, and remove every hook.

        ``flush=False`` (after a failure, when other ranks may never reach the collective
        a flush makes) drops the steps not yet reduced and only removes the hooks.
        """
        try:
            if flush:
                self.flush()
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        finally:
            self._hooks.remove()
            for undo in self._undo:
                undo()
            self._undo = []

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

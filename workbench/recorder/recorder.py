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

Where the parts live: the recorder wires them together and runs the step; the parameter-side
sites, a batch per kernel call (``parameter_side``); the per-micro-batch sites from hooks
(``activation_side``, with ``moe``); from a tensor to its site's accumulators (``slots``);
which sites exist and in what order (``registry``); the accumulators of a step and their
reduction over ranks (``step_state``); snapshots (``snapshots``); where the hooks attach
(``hooks``); the statistics pass itself (``kernels``).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from workbench.config import RecordConfig
from workbench.errors import ArgumentError
from workbench.recorder import kernels
from workbench.recorder.activation_side import ActivationSide
from workbench.recorder.hooks import Undo, hook_optimizer_step, wrap_finalize
from workbench.recorder.live import LiveCheck
from workbench.recorder.parameter_side import ParameterSide
from workbench.recorder.registry import SiteRegistry
from workbench.recorder.replicas import Parting, ReplicaCheck
from workbench.recorder.slots import Slots, Stopwatch
from workbench.recorder.snapshots import write_snapshots
from workbench.recorder.step_state import PendingStep, Reduction, StepState, launch_reduction
from workbench.recorder.targets import ParallelRanks, all_gather_objects, owned_targets, parameter_targets
from workbench.recorder.unrecordable import refusal, replicas, sharded_snapshots, withheld
from workbench.sites import PARAMETER_KINDS, SiteFilter, site_id, site_matcher
from workbench.store import layout
from workbench.store.writer import BackgroundWriter, SiteWriter, contiguous_ranges, update_manifest


class Recorder:
    def __init__(self, chunks: Sequence[torch.nn.Module], *, run_dir: str | Path, total_steps: int,
                 optimizer: Any = None, record: RecordConfig | None = None, precision: str = "fp32",
                 global_batch_size: int | None = None, flush_every: int = 10,
                 sites: SiteFilter | None = None, live: LiveCheck | None = None) -> None:
        self.record = record or RecordConfig()
        chunks = list(chunks)
        why = refusal(chunks, optimizer)
        if why is not None:
            raise ArgumentError(why)
        self.live = live
        """Where each flush's reduced numbers are compared with a reference (``recorder.live``), if anywhere."""
        self._optimizer = optimizer
        self._run_dir = Path(run_dir)
        self._site_writer: SiteWriter | None = None
        ranks = ParallelRanks.current()
        self._rank = dist.get_rank() if dist.is_initialized() else 0
        self._flush_every = flush_every
        wanted = site_matcher(sites if sites is not None else self.record.sites)
        dense, expert = replicas()
        self._withheld = withheld(chunks, self.record.kinds, dp_size=dense, expert_dp_size=expert)
        """Kinds asked for that this training would record wrong -> why (``recorder.unrecordable``)."""
        kinds = set(self.record.kinds) - set(self._withheld)
        self._rows = {step: row for row, step in enumerate(self.record.recorded_steps(total_steps))}
        self._registry = SiteRegistry(wanted, ranks)
        self._slots = Slots(self._registry, precision=precision, fused=self.record.compile,
                            snapshot_wanted=site_matcher(self.record.snapshot_sites))
        self._clock = Stopwatch()
        targets = parameter_targets(chunks, ranks)
        snapshotted = site_matcher(self.record.snapshot_sites)
        whole = bool(self.record.snapshot_steps) and any(
            snapshotted(site_id(kind, target.name)) for target in targets for kind in kinds & PARAMETER_KINDS)
        owned = owned_targets(targets, ranks, optimizer, split_replicas=not whole)
        why = sharded_snapshots(owned, kinds, site_matcher(self.record.snapshot_sites)) \
            if self.record.snapshot_steps else None
        if why is not None:
            raise ArgumentError(why)
        self._parameters = ParameterSide(targets, slots=self._slots, kinds=kinds, wanted=wanted, owned=owned)
        self._replicas = ReplicaCheck(targets, ranks)
        self._parted: Parting | None = None
        self._activations = ActivationSide(chunks, slots=self._slots, ranks=ranks, kinds=kinds,
                                           global_batch=global_batch_size or 0, clock=self._clock)
        self._paths_before = collections.Counter(kernels.PATHS)
        self._begin = self._clock.timed(self._start)
        self._gradients = self._clock.timed(self._parameters.gradients)
        targets = self._parameters.targets
        self._device = targets[0].param.device if targets else torch.device("cpu")
        self._kinds = kinds
        self._pending: list[PendingStep] = []
        self._writer: BackgroundWriter | None = None
        self._undo: list[Undo] = []
        """What ``close`` undoes: wrapped config functions and optimizer steps."""
        # Reduced gradients are read when the optimizer step begins; without an optimizer, after
        # config.finalize_model_grads_func.
        hooked = None if optimizer is None else hook_optimizer_step(optimizer, self._on_gradients_reduced)
        if hooked is not None:
            self._undo.append(hooked)
        self._undo += wrap_finalize(chunks, self._before_reduction,
                                    self._on_gradients_reduced if hooked is None else None)

    def parameter_count(self) -> int:
        """Parameters of the full model, each counted once (collective: it gathers the names every
        pipeline stage and tensor-parallel rank holds, with their full shapes)."""
        local = {t.name: int(np.prod(t.placement.full_shape, dtype=np.int64)) for t in self._parameters.targets}
        merged: dict[str, int] = {}
        for part in all_gather_objects(local):
            merged.update(part)
        return sum(merged.values())

    # -- the step ------------------------------------------------------------------------

    def step_begin(self, step: int) -> None:
        """Start step ``step``: records parameters as the forward will see them."""
        self._begin(step)

    def _start(self, step: int) -> None:
        self._activations.begin()
        if step not in self._rows:
            self._slots.state = None
            return
        self._slots.begin(step, snapshots=step in self.record.snapshot_steps)
        self._activations.hooks.attach()
        self._parameters.begin()
        self._replicas.params(step)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Within a step, run forward passes that are not recorded (a validation loss, say)."""
        state, self._slots.state = self._slots.state, None
        try:
            with self._activations.paused():
                yield
        finally:
            self._slots.state = state

    def step_end(self, step: int) -> float:
        """Finish step ``step`` (after the optimizer step); return the recorder's seconds for it."""
        start = time.perf_counter()
        state = self._slots.state
        if state is not None:
            with torch._C.DisableTorchFunction():
                self._parameters.after_optimizer(self._optimizer)
            self._slots.state = None
            self._finish(step, state)
            if step + 1 not in self._rows:  # the next step runs without module hooks
                self._activations.hooks.remove()
        return self._clock.take() + time.perf_counter() - start

    def microbatch(self, sample_offset: int) -> None:
        """Declare the global index of the first sample of the micro-batch about to run."""
        self._activations.declare(sample_offset)

    # -- gradients, before and after the data-parallel reduction -----------------------------

    def _before_reduction(self) -> None:
        if self._slots.state is not None and "grad_local" in self._kinds:
            self._gradients("grad_local")

    def _on_gradients_reduced(self) -> None:
        state = self._slots.state
        if state is not None and not state.grads_recorded:
            state.grads_recorded = True  # once per step, however many optimizers step
            self._replicas.grads(self._slots.step)
            if "grad" in self._kinds:
                self._gradients("grad")

    # -- the end of a step, flush (collective: every rank calls them at the same steps) ------

    def _finish(self, step: int, state: StepState) -> None:
        if self._registry.sites is None:
            self._registry.build(self._run_dir, rank=self._rank, steps=sorted(self._rows), kinds=self.record.kinds,
                                 optimizer_passed=self._optimizer is not None, withheld=self._withheld)
        self._pending.append(state.pending(self._rows[step], self._device))
        if step in self.record.snapshot_steps:
            write_snapshots(self._run_dir, state.snapshots, rank=self._rank, submit=self._background().submit)
        if len(self._pending) >= self._flush_every or self._rows[step] == len(self._rows) - 1:
            self._flush()  # step_end counts its time

    def flush(self) -> None:
        """Reduce the pending steps over all ranks and hand them to the writer (global rank 0)."""
        start = time.perf_counter()
        self._flush()
        self._clock.seconds += time.perf_counter() - start

    def _flush(self) -> None:
        if not self._pending or self._registry.sites is None:
            return
        parted = self._replicas.compare()  # collective, as the reduction below is
        if parted is not None and parted != self._parted and self._rank == 0:
            update_manifest(self._run_dir, replicas_parted=parted.to_dict())
        self._parted = parted
        reduction = launch_reduction(self._pending, self._registry.index, self._device, rank=self._rank)
        self._pending = []
        if reduction is None:
            return
        if self.live is not None:  # rank 0 compares now: the run may have to stop at this flush
            rows, stats, fingerprints = reduction.result()
            steps = {row: step for step, row in self._rows.items()}
            self.live.sites([steps[r] for r in rows], self._registry.sites, fingerprints, stats)
        # otherwise the writer's thread waits for the numbers (on a GPU, a side stream's copy to the host)
        self._background().submit(functools.partial(self._write_reduction, reduction))

    def _write_reduction(self, reduction: Reduction) -> None:
        """On the writer thread: the rows of one flush, once on the host (the sites group is opened at the first)."""
        rows, stats, fingerprints = reduction.result()
        if self._site_writer is None:
            self._site_writer = SiteWriter(self._run_dir)
        position = 0
        for first, stop in contiguous_ranges(rows):
            block = slice(position, position + stop - first)
            position += stop - first
            self._site_writer.write(first, stats[block], fingerprints[block])

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
            if flush and self._rank == 0 and layout.RunPaths(self._run_dir).store.exists():
                update_manifest(self._run_dir, statistics_paths=self.statistics_paths())
        finally:
            self._activations.hooks.remove()
            for undo in self._undo:
                undo()
            self._undo = []

    def statistics_paths(self) -> dict[str, Any]:
        """Which kernels read this rank's tensors (``kernels.PATHS``: tensors read per path since this recorder
        began), which could not be built on this machine and why, and what building the Triton ones took."""
        calls = collections.Counter(kernels.PATHS)
        calls.subtract(self._paths_before)
        return {"tensors_read": {path: n for path, n in sorted(calls.items()) if n > 0},
                "build_failures": dict(kernels.BUILD_FAILURES), "build_seconds": dict(kernels.BUILD_SECONDS)}

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

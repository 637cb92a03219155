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
piece, into its own chunk.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from workbench.config import RecordConfig
from workbench.errors import DamagedStoreError
from workbench.recorder import kernels
from workbench.recorder.moe import MoEHooks, moe_layers
from workbench.recorder.placement import Placement, activation_placement, token_placement
from workbench.recorder.targets import (
    ParallelRanks,
    activation_modules,
    adam_moments,
    first_tensor,
    is_feature_sharded,
    parameter_targets,
    unwrap,
)
from workbench.sites import SITE_KINDS, expert_of, layer_of, site_id
from workbench.statistics import PRECISION_LIMITS, assemble
from workbench.store import layout
from workbench.store.writer import (
    BackgroundWriter,
    SiteInfo,
    contiguous_ranges,
    create_sites_group,
    create_snapshot,
    update_manifest,
    write_site_rows,
    write_snapshot_region,
)

SiteFilter = str | Sequence[str] | Callable[[str], bool]
_BACKWARD_KINDS = {"act_grad"}


def site_matcher(sites: SiteFilter) -> Callable[[str], bool]:
    """A predicate over site ids from a glob, a list of globs, or a predicate."""
    if callable(sites):
        return sites
    patterns = [sites] if isinstance(sites, str) else list(sites)
    # cached: the recorder asks about the same few hundred sites at every micro-batch
    return functools.cache(lambda site: any(fnmatch.fnmatchcase(site, p) for p in patterns))


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


@dataclass
class _Accumulator:
    acc: torch.Tensor      # [11] float64: 8 sums, then max, -min, absmax
    lanes: torch.Tensor    # [2] int64: fingerprint lane sums


@dataclass
class _LocalSite:
    kind: str
    name: str
    order: tuple[int, int, int, int, int]
    """(kind, stage, position seen, global expert, position seen): experts in global order across EP ranks."""
    shape: tuple[int, ...]
    dtype: str


@dataclass
class _PendingStep:
    row: int
    sites: list[str]
    sums: torch.Tensor     # [n_local, 8]
    maxes: torch.Tensor    # [n_local, 3]
    lanes: torch.Tensor    # [n_local, 2]


@dataclass
class _Snapshot:
    path: str
    full_shape: tuple[int, ...]
    chunks: tuple[int, ...]       # this piece's shape in full-dimension order: its own chunk
    region: tuple[slice, ...]     # where the piece sits in the full tensor
    values: np.ndarray            # in full-dimension order
    source_dtype: str


@dataclass
class _StepState:
    acc: dict[str, _Accumulator] = field(default_factory=dict)
    before: dict[str, torch.Tensor] = field(default_factory=dict)
    snapshots: list[_Snapshot] = field(default_factory=list)
    grads_recorded: bool = False
    _blocks: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    _used: int = 0

    def new_accumulator(self, device: torch.device) -> _Accumulator:
        """Empty accumulators, handed out as rows of blocks (one allocation per 64 sites, not two per site)."""
        rows = _ACCUMULATOR_BLOCK
        if not self._blocks or self._used == rows or self._blocks[-1][0].device != device:
            acc, lanes = kernels.new_accumulators(device)
            self._blocks.append((acc.repeat(rows, 1), lanes.repeat(rows, 1)))
            self._used = 0
        acc_block, lane_block = self._blocks[-1]
        self._used += 1
        return _Accumulator(acc_block[self._used - 1], lane_block[self._used - 1])


_ACCUMULATOR_BLOCK = 64


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
        self._coords: dict[tuple[Placement, torch.device], torch.Tensor] = {}
        self._activation_placements: dict[tuple[Any, ...], Placement] = {}
        self._tiny, self._largest = PRECISION_LIMITS[precision]
        self._rows = {step: row for row, step in enumerate(self.record.recorded_steps(total_steps))}
        self._params = parameter_targets(self._chunks, self._ranks)
        self._device = self._params[0].param.device if self._params else torch.device("cpu")
        self._local: dict[str, _LocalSite] = {}
        self._seen = 0
        self._expert_blocks: dict[tuple[str, str], int] = {}
        self._seq_length = 0
        self._sequence_parallel = any(getattr(getattr(m, "config", None), "sequence_parallel", False)
                                      for c in self._chunks for m in (c, unwrap(c)))
        self._before: dict[str, torch.Tensor] = {}
        """Each ``update`` site's parameter as the step began (buffers reused at every recorded step)."""
        self._registry: list[str] | None = None
        self._index: dict[str, int] = {}
        self._pending: list[_PendingStep] = []
        self._state: _StepState | None = None
        self._step = -1
        self._offset = 0
        self._explicit_offset: int | None = None
        self._samples_seen = 0
        self._seconds = 0.0
        self._writer: BackgroundWriter | None = None
        self._handles: list[Any] = []
        self._undo: list[Callable[[], None]] = []
        """What ``close`` undoes: wrapped config functions and optimizer steps."""
        self._attach()

    def parameter_count(self) -> int:
        """Parameters of the full model, each counted once (collective: it gathers the names every
        pipeline stage and tensor-parallel rank holds, with their full shapes)."""
        local = {t.name: int(np.prod(t.placement.full_shape, dtype=np.int64)) for t in self._params}
        merged: dict[str, int] = {}
        for part in all_gather_objects(local):
            merged.update(part)
        return sum(merged.values())

    # -- hooks ---------------------------------------------------------------------------

    def _attach(self) -> None:
        # Reduced gradients are read when the optimizer step begins: after every reduction the
        # loop makes (finalize_model_grads, called by a schedule or by the loop itself), before
        # any change the optimizer makes. Without an optimizer, after config.finalize_model_grads_func.
        grads_at_finalize = self._optimizer is None or not self._hook_optimizer_step(self._optimizer)
        for chunk in self._chunks:
            self._handles.append(unwrap(chunk).register_forward_pre_hook(self._on_microbatch_start))
            config = getattr(chunk, "config", None)
            original = getattr(config, "finalize_model_grads_func", None)
            if config is not None and original is not None and not getattr(original, "_workbench_recorder", False):
                self._undo.append(functools.partial(setattr, config, "finalize_model_grads_func", original))
                config.finalize_model_grads_func = self._wrap_finalize(original, grads=grads_at_finalize)
            model = unwrap(chunk)
            if "loss" in self._kinds:
                self._handles.append(model.register_forward_hook(self._on_model_output))
        if self._kinds & {"act", "loss"}:
            layers = moe_layers(self._chunks)
            if layers:
                hooks = MoEHooks(layers, record=self._record_timed, offset=lambda: self._offset,
                                 seq_shard=self._seq_shard,
                                 global_batch=lambda batch: self._global_batch or batch,
                                 wanted=lambda kind: kind in self._kinds, active=lambda: self._state is not None,
                                 tp_rank=self._ranks.tp_rank, expert_tp_size=self._ranks.expert_tp_size)
                self._undo.append(hooks.remove)
        if self._kinds & {"act", "act_grad"}:
            for name, module in activation_modules(self._chunks):
                sharded = is_feature_sharded(module)
                self._handles.append(module.register_forward_hook(
                    lambda m, args, out, name=name, sharded=sharded: self._on_activation(name, out, sharded)))

    def _wrap_finalize(self, original: Callable[..., Any], *, grads: bool) -> Callable[..., Any]:
        def finalize(*args: Any, **kwargs: Any) -> Any:
            if self._state is not None and "grad_local" in self._kinds:
                self._record_gradients("grad_local")
            result = original(*args, **kwargs)
            if grads:
                self._on_gradients_reduced()
            return result

        finalize._workbench_recorder = True  # type: ignore[attr-defined]
        return finalize

    def _hook_optimizer_step(self, optimizer: Any) -> bool:
        """Call ``_on_gradients_reduced`` when ``optimizer.step`` begins; False if it has no ``step``.

        A torch optimizer gets a step pre-hook; any other (Megatron's, the runner's) has its
        bound ``step`` wrapped on the instance, which ``close`` undoes.
        """
        if isinstance(optimizer, torch.optim.Optimizer):
            self._handles.append(optimizer.register_step_pre_hook(lambda *_: self._on_gradients_reduced()))
            return True
        step = getattr(optimizer, "step", None)
        if not callable(step):
            return False
        own = "step" in vars(optimizer)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self._on_gradients_reduced()
            return step(*args, **kwargs)

        optimizer.step = wrapped
        self._undo.append(lambda: setattr(optimizer, "step", step) if own else delattr(optimizer, "step"))
        return True

    def _on_gradients_reduced(self) -> None:
        state = self._state
        if state is not None and "grad" in self._kinds and not state.grads_recorded:
            state.grads_recorded = True  # once per step, however many optimizers step
            self._record_gradients("grad")

    def microbatch(self, sample_offset: int) -> None:
        """Declare the global index of the first sample of the micro-batch about to run."""
        self._explicit_offset = sample_offset

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
        tensor = first_tensor(output)
        if self._state is None or tensor is None or tensor.ndim < 2:
            return
        # the same few placements recur at every step: one per site and micro-batch
        key = (name, tensor.shape, self._offset, self._seq_length)
        placement = self._activation_placements.get(key)
        if placement is None:
            placement = self._activation_placements[key] = activation_placement(
                tuple(tensor.shape), sample_offset=self._offset, global_batch=self._global_batch or tensor.shape[1],
                feature_shard=(self._ranks.tp_rank, self._ranks.tp_size) if sharded else None,
                tp_rank=self._ranks.tp_rank, seq_shard=self._seq_shard(tensor.shape[0]))
        if "act" in self._kinds:
            self._record("act", name, tensor, placement)
        if "act_grad" in self._kinds and tensor.requires_grad:
            tensor.register_hook(lambda grad, name=name, placement=placement: self._on_gradient(name, grad, placement))

    def _seq_shard(self, length: int) -> tuple[int, int] | None:
        """(TP rank, TP size) when an activation of ``length`` positions is this rank's share of the sequence."""
        tp = self._ranks.tp_size
        if self._sequence_parallel and tp > 1 and length * tp == self._seq_length:
            return self._ranks.tp_rank, tp
        return None

    @_timed
    def _on_gradient(self, name: str, grad: torch.Tensor, placement: Placement) -> None:
        if self._state is not None:
            # Each DP rank differentiates the mean loss of its own share of the batch: scaled
            # by 1/dp this is the gradient of the global-batch loss, the same for every layout
            # (exactly so for power-of-two DP sizes).
            if self._ranks.dp_size > 1:
                grad = grad / self._ranks.dp_size
            self._record("act_grad", name, grad, placement)

    @_timed
    def _on_model_output(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        tensor = first_tensor(output)
        if self._state is None or tensor is None or tensor.ndim != 2 or not tensor.is_floating_point():
            return
        placement = token_placement(tuple(tensor.shape), sample_offset=self._offset,
                                    global_batch=self._global_batch or tensor.shape[0], tp_rank=self._ranks.tp_rank)
        self._record("loss", "cross_entropy", tensor, placement)

    def _record_gradients(self, kind: str) -> None:
        start = time.perf_counter()
        entries = []
        for target in self._params:
            # Megatron DDP's main_grad is a view into the contiguous grad buffer: the batch below
            # reads the buffer's segments in one native call.
            grad = getattr(target.param, "main_grad", None)
            grad = target.param.grad if grad is None else grad
            if grad is not None:  # grad_local: each DP rank holds its own partial sum; DP rank 0's counts
                entries.append((kind, target.name, grad, target.placement))
        self._record_many(entries)
        self._seconds += time.perf_counter() - start

    # -- recording ----------------------------------------------------------------------

    def _register(self, kind: str, name: str, placement: Placement, dtype: torch.dtype) -> str | None:
        """The site id if it is wanted (registering it on first sight), else None.

        Every rank registers every site it sees, counted or not, so that replicas number
        their sites alike and the execution order is the same on every rank.
        """
        site = site_id(kind, name)
        if not self._wanted(site):
            return None
        if site not in self._local:
            if self._registry is not None:
                raise RuntimeError(f"site {site} first appeared after the first recorded step; "
                                   "every recorded step must see the same sites")
            stage = -self._ranks.pp_rank if kind in _BACKWARD_KINDS else self._ranks.pp_rank
            expert = expert_of(name)
            # EP ranks see different experts at the same position: a layer's experts are ordered
            # by global index from the position where the first of them was seen.
            block = self._seen if expert is None else \
                self._expert_blocks.setdefault((kind, name.partition(".experts.")[0]), self._seen)
            self._local[site] = _LocalSite(kind, name, (SITE_KINDS.index(kind), stage, block, expert or 0, self._seen),
                                           placement.full_shape, str(dtype).removeprefix("torch."))
            self._seen += 1
        return site

    def _record(self, kind: str, name: str, tensor: torch.Tensor, placement: Placement) -> None:
        """Record one tensor (an activation or its gradient: hundreds of calls a step, so no batching)."""
        slot = self._slot(kind, name, placement, tensor)
        if slot is not None:
            site, coords, acc, lanes = slot
            self._snapshot(kind, name, site, tensor, placement)
            kernels.accumulate(tensor, coords, self._tiny, self._largest, acc, lanes, fused=self._fused)

    @_timed
    def _record_timed(self, kind: str, name: str, tensor: torch.Tensor, placement: Placement) -> None:
        self._record_many([(kind, name, tensor, placement)])

    def _record_many(self, entries: list[tuple[str, str, torch.Tensor, Placement]]) -> None:
        """Record each (kind, name, tensor, placement): the statistics of all of them in one kernel call."""
        items = []
        for kind, name, tensor, placement in entries:
            slot = self._slot(kind, name, placement, tensor)
            if slot is not None:
                self._snapshot(kind, name, slot[0], tensor, placement)
                items.append((tensor, *slot[1:]))
        if items:
            kernels.accumulate_many(items, self._tiny, self._largest, fused=self._fused)

    def _slot(self, kind: str, name: str, placement: Placement, tensor: torch.Tensor,
              dtype: torch.dtype | None = None) -> tuple[str, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(site, coords, acc, lanes) for the kernel if the site is recorded here, else None."""
        site = self._register(kind, name, placement, dtype or tensor.dtype)
        if site is None or not placement.contributes:
            return None
        assert self._state is not None
        key = (placement, tensor.device)
        coords = self._coords.get(key)
        if coords is None:
            coords = self._coords[key] = placement.coords(tensor.device)
        acc = self._state.acc.get(site)
        if acc is None:  # first micro-batch of this site in this step; later ones add in
            acc = self._state.acc[site] = self._state.new_accumulator(tensor.device)
        return site, coords, acc.acc, acc.lanes

    def _snapshot_due(self, site: str) -> bool:
        return self._step in self.record.snapshot_steps and self._snapshot_wanted(site)

    def _snapshot(self, kind: str, name: str, site: str, tensor: torch.Tensor, placement: Placement) -> None:
        """Keep a copy of ``tensor`` for the store if this step snapshots ``site``."""
        if not self._snapshot_due(site):
            return
        assert self._state is not None
        # copy=True: a CPU fp32 tensor would otherwise be shared, and the optimizer changes it
        # before the writer thread reads it.
        dtype = torch.float64 if tensor.dtype == torch.float64 else torch.float32
        values = placement.to_full_order(tensor.detach()).to("cpu", dtype, copy=True)
        local_shape = tuple(tensor.shape)
        self._state.snapshots.append(_Snapshot(
            layout.snapshot_path(self._step, kind, name), placement.full_shape,
            placement.chunk_shape(local_shape), placement.region(local_shape), values.numpy(),
            str(tensor.dtype).removeprefix("torch.")))

    @_timed
    def step_begin(self, step: int) -> None:
        """Start step ``step``: records parameters as the forward will see them."""
        self._step = step
        self._samples_seen = 0
        self._state = _StepState() if step in self._rows else None
        if self._state is None:
            return
        if "param" in self._kinds:
            self._record_many([("param", t.name, t.param, t.placement) for t in self._params])
        if "update" in self._kinds:
            for target in self._params:
                if target.placement.contributes and self._wanted(site_id("update", target.name)):
                    # One buffer per parameter, kept between recorded steps: a copy into it costs a
                    # third of a fresh clone (no allocation, no page faults).
                    before = self._before.get(target.name)
                    if before is None:
                        before = self._before[target.name] = torch.empty_like(target.param, requires_grad=False)
                    before.copy_(target.param.detach())
                    self._state.before[target.name] = before

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
            self._record_optimizer(state)
            self._state = None
            self._finish(step, state)
        seconds = self._seconds + time.perf_counter() - start
        self._seconds = 0.0
        return seconds

    def _record_optimizer(self, state: _StepState) -> None:
        if self._optimizer is not None and self._kinds & {"exp_avg", "exp_avg_sq"}:
            moments = list(adam_moments(self._optimizer, self._params))
            if "exp_avg" in self._kinds:
                self._record_many([("exp_avg", t.name, avg, t.placement) for t, avg, _ in moments])
            if "exp_avg_sq" in self._kinds:
                self._record_many([("exp_avg_sq", t.name, avg_sq, t.placement) for t, _, avg_sq in moments])
        if "update" in self._kinds:
            self._record_updates(state)

    def _record_updates(self, state: _StepState) -> None:
        """The ``update`` sites: each parameter minus its copy from the start of the step, taken element by
        element inside the statistics pass (materialised only for a snapshot)."""
        differences, materialised = [], []
        for target in self._params:
            self._register("update", target.name, target.placement, torch.float32)  # in parameter order
            before = state.before.get(target.name)
            if before is None:
                continue
            slot = self._slot("update", target.name, target.placement, target.param, torch.float32)
            if slot is None:
                continue
            site, coords, acc, lanes = slot
            after = target.param.detach()
            if self._snapshot_due(site):
                update = after.float() - before.float()
                self._snapshot("update", target.name, site, update, target.placement)
                materialised.append((update, coords, acc, lanes))
            else:
                differences.append((after, before, coords, acc, lanes))
        kernels.accumulate_differences(differences, self._tiny, self._largest, fused=self._fused)
        if materialised:
            kernels.accumulate_many(materialised, self._tiny, self._largest, fused=self._fused)

    def _finish(self, step: int, state: _StepState) -> None:
        if self._registry is None:
            self._build_registry()
        sites = list(state.acc)
        if sites:
            acc = torch.stack([state.acc[s].acc for s in sites])
            sums, maxes = acc[:, :8], acc[:, 8:]
            lanes = torch.stack([state.acc[s].lanes for s in sites])
        else:
            sums = torch.zeros(0, 8, dtype=torch.float64, device=self._device)
            maxes = torch.zeros(0, 3, dtype=torch.float64, device=self._device)
            lanes = torch.zeros(0, 2, dtype=torch.int64, device=self._device)
        self._pending.append(_PendingStep(self._rows[step], sites, sums, maxes, lanes))
        if step in self.record.snapshot_steps:
            self._write_snapshots(state.snapshots)
        last_row = len(self._rows) - 1
        if len(self._pending) >= self._flush_every or self._rows[step] == last_row:
            self.flush()

    # -- registry, flush, snapshots (collective: every rank calls them at the same steps) --

    def _build_registry(self) -> None:
        entries = [(site, s.kind, s.name, s.order, s.shape, s.dtype) for site, s in self._local.items()]
        gathered = all_gather_objects(entries)
        best: dict[str, tuple[Any, ...]] = {}
        for entry in (e for rank_entries in gathered for e in rank_entries):
            if entry[0] not in best or entry[3] < best[entry[0]][3]:
                best[entry[0]] = entry
        ordered = sorted(best.values(), key=lambda e: (e[3], e[0]))
        self._registry = [e[0] for e in ordered]
        self._index = {site: i for i, site in enumerate(self._registry)}
        seen = {e[1] for e in ordered}
        missing = {kind: self._why_missing(kind) for kind in self.record.kinds if kind not in seen}
        if missing and self._rank == 0:
            warnings.warn("the recorder was asked for site kinds it never saw in the first recorded step: "
                          + "; ".join(f"{kind}: {why}" for kind, why in missing.items()), stacklevel=2)
            update_manifest(self._run_dir, kinds_missing=missing)
        if self._rank == 0:
            infos = [SiteInfo(site=e[0], kind=e[1], name=e[2], layer=_layer_number(e[2]), order=i,
                              shape="x".join(map(str, e[4])), dtype=e[5], numel=int(np.prod(e[4], dtype=np.int64)))
                     for i, e in enumerate(ordered)]
            steps = sorted(self._rows)
            if not _sites_group_matches(self._run_dir, steps, self._registry):
                create_sites_group(self._run_dir, steps, infos)

    def _why_missing(self, kind: str) -> str:
        """The likely reason that no site of ``kind`` was seen (the site filter may also exclude them all)."""
        reasons = {
            "grad": "no reduced gradient reached the recorder: pass the optimizer (its step is where they are read)",
            "grad_local": "the gradient before the reduction is read only in config.finalize_model_grads_func, "
                          "which the model's config does not set",
            "exp_avg": "no optimizer was passed, or it holds no Adam moments",
            "exp_avg_sq": "no optimizer was passed, or it holds no Adam moments",
            "loss": "the model's output is not a per-token loss (call it with labels)",
            "act": "no activation module of a GPT model was found",
            "act_grad": "no activation that requires a gradient was found",
        }
        if kind == "grad" and self._optimizer is not None:
            return "the optimizer's step did not run in the first recorded step, or no parameter had a gradient"
        return reasons.get(kind, "never produced") + " (or the site filter excludes all its sites)"

    def flush(self) -> None:
        """Reduce the pending steps over all ranks and hand them to the writer (global rank 0)."""
        if not self._pending or self._registry is None:
            return
        start = time.perf_counter()
        n, k = len(self._registry), len(self._pending)
        sums = torch.zeros(k, n, 8, dtype=torch.float64, device=self._device)
        maxes = torch.full((k, n, 3), float("-inf"), dtype=torch.float64, device=self._device)
        lanes = torch.zeros(k, n, 2, dtype=torch.int64, device=self._device)
        for i, pending in enumerate(self._pending):
            if pending.sites:
                index = torch.tensor([self._index[s] for s in pending.sites], device=self._device)
                sums[i, index] = pending.sums.to(self._device)
                maxes[i, index] = pending.maxes.to(self._device)
                lanes[i, index] = pending.lanes.to(self._device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sums)
            dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
            dist.all_reduce(lanes)
        rows = [p.row for p in self._pending]
        self._pending = []
        if self._rank == 0:
            stats = assemble(sums.cpu().numpy(), maxes.cpu().numpy())       # one host copy per flush
            lane_values = lanes.cpu().numpy().astype(np.uint64) & np.uint64(0xFFFFFFFF)
            fingerprints = (lane_values[..., 1] << np.uint64(32)) | lane_values[..., 0]
            position = 0
            for first, stop in contiguous_ranges(rows):
                block = slice(position, position + stop - first)
                position += stop - first
                self._background().submit(functools.partial(write_site_rows, self._run_dir, first, stats[block],
                                                            fingerprints[block]))
        self._seconds += time.perf_counter() - start

    def _write_snapshots(self, snapshots: list[_Snapshot]) -> None:
        meta = [(s.path, s.full_shape, s.chunks, s.source_dtype, str(s.values.dtype)) for s in snapshots]
        gathered = all_gather_objects(meta)
        if self._rank == 0:
            created = set()
            for path, shape, chunks, source_dtype, dtype in (m for rank_meta in gathered for m in rank_meta):
                if path not in created:
                    create_snapshot(self._run_dir, path, shape, chunks, dtype, source_dtype)
                    created.add(path)
        if dist.is_initialized():
            dist.barrier()
        for snap in snapshots:
            self._background().submit(functools.partial(write_snapshot_region, self._run_dir, snap.path,
                                                        snap.region, snap.values))

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
            for handle in self._handles:
                handle.remove()
            self._handles = []
            for undo in self._undo:
                undo()
            self._undo = []

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _layer_number(name: str) -> int:
    """Global layer of a site name, -1 outside the transformer layers (the stored convention)."""
    layer = layer_of(name)
    return -1 if layer is None else layer


def all_gather_objects(obj: Any) -> list[Any]:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def _sites_group_matches(run_dir: Path, steps: list[int], registry: list[str]) -> bool:
    """True if the store already has a ``sites`` group for exactly these steps and sites (a resume)."""
    import zarr

    try:
        group = layout.subgroup(zarr.open_group(layout.RunPaths(run_dir).store, mode="r"), layout.SITES_GROUP)
        return (np.asarray(layout.array(group, layout.STEP_DIM)[:]).tolist() == steps
                and [str(s) for s in np.asarray(layout.array(group, layout.SITE_DIM)[:])] == registry)
    except DamagedStoreError:
        return False

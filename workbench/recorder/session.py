"""Record a researcher's own Megatron Core training: one call around the loop, two lines in it.

    from workbench.recorder import record

    with record("runs/mine", model_chunks, optimizer, steps=steps, global_batch_size=gbs,
                user_config=vars(args)) as run:
        for step in range(steps):
            with run.step(step):
                losses = forward_backward_func(...)
                finalize_model_grads(model_chunks)
                optimizer.step()
                run.log(loss=loss, grad_norm=grad_norm, lr=lr)

``record`` reads the manifest off the live objects (the model's ``TransformerConfig``,
``parallel_state``, torch's determinism switches, the environment, the git revision of the
working directory), creates the store on global rank 0 while the others wait, and attaches
the ``Recorder``. ``run.step`` measures the step time; ``run.log`` takes the scalars the
loop has (on whichever rank has them: with pipeline parallelism the loss lives on the last
stage). The status ends ``complete``, ``failed`` with the exception's message, or, when
the process dies, reads ``interrupted``: on the writer's host by its pid, on any other host
by the heartbeat rank 0 writes every ``heartbeat_s`` seconds.

With ``against=REF`` (a run folder or a golden-values file; ``rtol`` as ``workbench check``) the run is
compared with REF as it trains (``analysis.live``): at the first flush that departs, ``run.step`` raises
``workbench.errors.RunDiverged`` on every rank, the store ends ``diverged`` and its manifest says where
(``keep_going=True``: the verdict is recorded and nothing is raised). A reference of another model, or
one lacking steps the run records, is refused by ``record`` itself.

    try:
        with record(..., against="golden.json") as run:
            ...
    except RunDiverged as stop:
        print(stop.departure.step, stop.departure.site)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workbench import determinism, environment
from workbench.config import RecordConfig
from workbench.errors import ArgumentError, IncomparableRunsError, RunDiverged, WorkbenchError
from workbench.recorder.live import LiveCheck
from workbench.recorder.recorder import Recorder
from workbench.recorder.reference import load_reference
from workbench.recorder.rounding import RoundingProbe
from workbench.recorder.targets import all_gather_objects, hybrid_pattern, unwrap
from workbench.sites import SiteFilter, gpt_blocks
from workbench.store import layout
from workbench.store.manifest import (
    USER_LOOP,
    ModelSignature,
    ParallelLayout,
    RunManifest,
    environment_facts,
    new_run_id,
    store_attributes,
)
from workbench.store.writer import ScalarWriter, create_store, set_status, update_manifest
from workbench.store.writer_lock import RunFolderBusy, WriterLock, acquire
from workbench.versions import check_megatron_core

LOGGED = ("loss", "grad_norm", "lr", "loss_scale", "tokens", "skipped", "val_loss")
"""What ``TrainingRun.log`` takes; ``tokens`` (this step's, all ranks together) gives tokens/s;
``val_loss`` is a held-out loss computed after the step's update, at the steps that have one."""


def live_layout(config: Any) -> ParallelLayout:
    """The layout of this process group, from ``parallel_state`` (TP=PP=DP=1 when it is not initialised)."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        if dist.is_initialized() and dist.get_world_size() > 1:
            raise ArgumentError(f"{dist.get_world_size()} processes run but megatron.core.parallel_state is not "
                                "initialised: call parallel_state.initialize_model_parallel(...) before record()")
        return ParallelLayout()
    vp = getattr(config, "virtual_pipeline_model_parallel_size", None)
    return ParallelLayout(tp=ps.get_tensor_model_parallel_world_size(), pp=ps.get_pipeline_model_parallel_world_size(),
                          dp=ps.get_data_parallel_world_size(), vp=vp, sp=bool(getattr(config, "sequence_parallel",
                                                                                          False)),
                          cp=ps.get_context_parallel_world_size(), ep=ps.get_expert_model_parallel_world_size())


def live_precision(config: Any) -> str:
    """The precision the model computes in, from its ``TransformerConfig`` (fp8: Transformer Engine's recipe on,
    whose e4m3 limits then count the underflows and overflows)."""
    if getattr(config, "fp8", None):
        return "fp8"
    if getattr(config, "bf16", False):
        return "bf16"
    if getattr(config, "fp16", False):
        return "fp16"
    dtype = getattr(config, "params_dtype", torch.float32)
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def live_determinism(config: Any, *, on_gpu: bool = False) -> dict[str, Any]:
    """Every determinism switch as this process has it: Megatron's, torch's and the environment's, and each
    nondeterminism source's state from them (``workbench.determinism.live_sources``)."""
    flags = {name: getattr(config, name) for name in ("deterministic_mode", "cross_entropy_loss_fusion")
             if hasattr(config, name)}
    torch_flag = torch.are_deterministic_algorithms_enabled()
    env = {key: os.environ.get(key) for key in determinism.NUMERICS_ENV_VARS}
    fast = determinism.fast_knobs(env, deterministic_mode=bool(flags.get("deterministic_mode", False)),
                                  torch_deterministic=torch_flag,
                                  fused_cross_entropy=bool(flags.get("cross_entropy_loss_fusion", False)))
    sources = determinism.live_sources(fast, on_gpu=on_gpu)
    return {
        "deterministic": bool(flags.get("deterministic_mode", False)) and torch_flag,
        "transformer_config": flags,
        "torch_use_deterministic_algorithms": torch_flag,
        "required_env": {},
        "env": env,
        "emulated_nondeterminism": [],
        "sources": {name: {"state": str(state.value), "does": determinism.SOURCES[name].gpu if on_gpu else
                           "nothing: CPU kernels are deterministic (record(..., emulate=[name]) emulates it)"}
                    for name, state in sources.items()},
    }


class _LoopModel(torch.nn.ModuleList):
    """A loop's chunks as the emulations take a model (``nondeterminism.install``): the GPT models, and the
    DDP-wrapped chunks whose gradient buckets the data-parallel emulation reorders."""

    def __init__(self, chunks: Sequence[torch.nn.Module]) -> None:
        super().__init__(list(chunks))
        self.gpts = [unwrap(chunk) for chunk in chunks]
        self.chunks = [chunk for chunk in chunks if hasattr(chunk, "bucket_groups")]


def _emulated(chunks: Sequence[torch.nn.Module], emulate: Sequence[str], switches: dict[str, Any], *,
              on_gpu: bool) -> dict[str, Any]:
    """Put on the CPU emulations of ``emulate`` in the loop's model; ``switches`` as the manifest then says them:
    nondeterministic, the sources on and what each emulation does."""
    from workbench.recorder import nondeterminism

    names = [emulate] if isinstance(emulate, str) else list(emulate)
    unknown = [name for name in names if name not in determinism.SOURCES]
    if unknown:
        raise ArgumentError(f"emulate={unknown[0]!r} is no nondeterminism source; the sources are "
                            f"{', '.join(determinism.SOURCES)}")
    if on_gpu:
        raise ArgumentError("emulate= is for a run on the CPU: on a GPU the sources are real (leave Megatron's "
                            "deterministic mode off)")
    states = {name: determinism.SourceState.ON for name in names}
    try:
        done = nondeterminism.install(_LoopModel(chunks), states)
    except ValueError as err:
        raise ArgumentError(f"emulate={names!r}: {err}") from None
    if not done:
        raise ArgumentError(f"emulate={names!r}: nothing in this model to emulate them in (Megatron's embedding, "
                            "MLP, attention, DDP buckets or MoE dispatcher)")
    sources = dict(switches.get("sources", {}))
    for name in names:
        sources[name] = {"state": "on", "does": determinism.SOURCES[name].cpu}
    return {**switches, "deterministic": False, "emulated_nondeterminism": done, "sources": sources}


def _signature(model: Any, config: Any, parameters: int) -> ModelSignature:
    missing = [what for what, value in (("vocab_size", getattr(model, "vocab_size", None)),
                                        ("max_sequence_length", getattr(model, "max_sequence_length", None)))
               if value is None]
    if missing or config is None:
        raise ArgumentError(f"record() needs Megatron Core GPTModel or HybridModel chunks: the model has no "
                            f"{', '.join(missing) or 'config'}")
    # a HybridModel named in the GPT spelling counts GPT blocks, as its names do (workbench.sites)
    blocks = gpt_blocks(hybrid_pattern(model))
    experts = getattr(config, "num_moe_experts", None) or None  # a MoE model never pairs with a dense one
    return ModelSignature(num_layers=blocks or config.num_layers, hidden_size=config.hidden_size,
                          num_attention_heads=config.num_attention_heads, vocab_size=int(model.vocab_size),
                          seq_length=int(model.max_sequence_length), parameters=parameters, num_experts=experts,
                          moe_topk=(getattr(config, "moe_router_topk", None) or None) if experts else None)


def _user_config_hash(user_config: Mapping[str, Any] | None) -> str | None:
    if user_config is None:
        return None
    text = json.dumps(user_config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class TrainingRun:
    """A run being recorded (see the module docstring); made by ``record``."""

    def __init__(self, run_dir: str | os.PathLike[str], chunks: Sequence[torch.nn.Module], optimizer: Any, *,
                 steps: int, name: str | None = None, global_batch_size: int | None = None,
                 user_config: Mapping[str, Any] | None = None, seed: int | None = None,
                 deterministic: bool | None = None, record: RecordConfig | None = None,
                 sites: SiteFilter | None = None, flush_every: int = 10, heartbeat_s: float = 30.0,
                 against: str | os.PathLike[str] | None = None, rtol: float | None = None,
                 keep_going: bool = False, producer: str = USER_LOOP, perturb: str | None = None,
                 emulate: Sequence[str] = ()) -> None:
        check_megatron_core()
        if not isinstance(steps, int) or steps < 1:
            raise ArgumentError(f"steps must be a positive number of training steps, not {steps!r}")
        if not chunks:
            raise ArgumentError("record() needs the model chunks (a list of GPTModel, DDP-wrapped or not)")
        if user_config is not None and not isinstance(user_config, Mapping):
            raise ArgumentError(f"user_config must be a mapping (vars(args), a dict), not {type(user_config).__name__}")
        self.run_dir = Path(run_dir)
        self._rank = dist.get_rank() if dist.is_initialized() else 0
        self._steps = steps
        self._flush_every = flush_every
        self._heartbeat_s = heartbeat_s
        model = unwrap(chunks[0])
        config = getattr(model, "config", None)
        precision = live_precision(config)
        self.recorder = Recorder(chunks, run_dir=self.run_dir, total_steps=steps, optimizer=optimizer, record=record,
                                 precision=precision, global_batch_size=global_batch_size, flush_every=flush_every,
                                 sites=sites)
        self.probe: RoundingProbe | None = None
        try:
            if perturb is not None:  # after the recorder's hooks: it records what each module computed
                self.probe = RoundingProbe(chunks, perturb)
            signature = _signature(model, config, self.recorder.parameter_count())
            device = next(model.parameters()).device
            switches = live_determinism(config, on_gpu=device.type == "cuda")
            if emulate:
                switches = _emulated(chunks, emulate, switches, on_gpu=device.type == "cuda")
            if deterministic is not None:
                switches["deterministic"] = deterministic
            name = name or self.run_dir.name
            self.manifest = RunManifest(run_id=new_run_id(name), name=name, producer=producer,
                                    model=signature, layout=live_layout(config), precision=precision,
                                    deterministic=switches["deterministic"], seed=seed, determinism=switches,
                                    user_config=dict(user_config) if user_config is not None else None,
                                    perturbation=self.probe.describe() if self.probe is not None else None)
            self._tokens_per_step = (global_batch_size * signature.seq_length) if global_batch_size else None
            self._keep_going = keep_going
            self.live = self._live_reference(against, rtol, signature, record) if against is not None else None
            self.recorder.live = self.live
            self._runtime = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                             "backend": dist.get_backend() if dist.is_initialized() else None,
                             "cuda": torch.version.cuda,
                             **(environment.collect(device=str(device), world_size=dist.get_world_size()
                                                    if dist.is_initialized() else 1,
                                                    settings=environment.megatron_settings(config))
                                if self._rank == 0 else {})}
            self._scalars: ScalarWriter | None = None
            self._lock = self._writer_lock(producer)
            if self._rank == 0:
                self._create_store(user_config)
            if dist.is_initialized():
                dist.barrier()  # the store exists before any rank records into it
        except BaseException:
            if self.probe is not None:
                self.probe.remove()
            self.recorder.close(flush=False)
            lock: WriterLock | None = getattr(self, "_lock", None)
            if lock is not None:
                lock.release()
            raise
        self._logged: dict[int, dict[str, float]] = {}
        self._current: dict[str, float] | None = None
        self._evaluation_s = 0.0
        self._stop_heartbeat = threading.Event()
        self._heartbeat: threading.Thread | None = None
        if self._rank == 0:
            self._heartbeat = threading.Thread(target=self._beat, name="workbench-heartbeat", daemon=True)
            self._heartbeat.start()

    def _writer_lock(self, producer: str) -> WriterLock | None:
        """The run folder's writer's lock, held by global rank 0 until ``close`` (``store.writer_lock``); a
        folder another process writes is refused on every rank, with rank 0's reason, before anything is
        written (collective)."""
        lock, refusal = None, None
        if self._rank == 0:
            try:
                lock = acquire(self.run_dir, writer=f"record() ({producer})",
                               rank=0 if dist.is_initialized() else None)
            except ArgumentError as err:
                refusal = (isinstance(err, RunFolderBusy), str(err))
        refusal = all_gather_objects(refusal)[0]
        if refusal is not None:
            busy, reason = refusal
            raise (RunFolderBusy if busy else ArgumentError)(reason)
        return lock

    def _create_store(self, user_config: Mapping[str, Any] | None) -> None:
        create_store(self.run_dir, store_attributes(
            self.manifest, status=layout.Status.RUNNING, user_config_hash=_user_config_hash(user_config),
            **environment_facts(Path.cwd()), working_directory=str(Path.cwd()), runtime=self._runtime,
            heartbeat={"at": time.time(), "every_s": self._heartbeat_s}, steps_planned=self._steps), self._steps)
        self._scalars = ScalarWriter(self.run_dir, self._flush_every)

    def _live_reference(self, against: str | os.PathLike[str], rtol: float | None, signature: ModelSignature,
                        record: RecordConfig | None) -> LiveCheck:
        """The reference (global rank 0 reads it), or ``IncomparableRunsError`` on every rank, with rank 0's
        reason, before anything is written."""
        reference, reason = None, None
        if self._rank == 0:  # a reference it cannot read is a reason too: the other ranks wait for one
            try:
                reference = load_reference(against, rtol=rtol)
                recorded = (record or RecordConfig()).recorded_steps(self._steps)
                reason = reference.refusal(model=signature.shape(), steps=range(self._steps), recorded=recorded)
            except WorkbenchError as err:
                reason = str(err)
        reason = all_gather_objects(reason)[0]
        if reason is not None:
            raise IncomparableRunsError(f"against={str(against)!r}: {reason}")
        return LiveCheck(reference, rank=self._rank)

    def _beat(self) -> None:
        while not self._stop_heartbeat.wait(self._heartbeat_s):
            update_manifest(self.run_dir, heartbeat={"at": time.time(), "every_s": self._heartbeat_s})

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[TrainingRun]:
        """The body of training step ``step``: records it, times it and stores the scalars logged in it."""
        if not 0 <= step < self._steps:
            raise ArgumentError(f"step {step} is outside the {self._steps} steps this run was created for")
        self._current = {}
        self._evaluation_s = 0.0
        start = time.perf_counter()
        self.recorder.step_begin(step)
        yield self
        recorder_time = self.recorder.step_end(step)
        step_time = time.perf_counter() - start - self._evaluation_s
        row, self._current = self._current, None
        tokens = row.pop("tokens", self._tokens_per_step)
        row["step_time"] = step_time
        row["recorder_time"] = recorder_time
        if tokens is not None:  # as the runner counts it: the training's own speed, the recorder left out
            row["tokens_per_s"] = tokens / max(step_time - recorder_time, 1e-9)
        self._logged[step] = row
        if len(self._logged) >= self._flush_every or step == self._steps - 1:
            self._flush_scalars(gather=True)
            if self.live is not None and not self.live.announced:
                self._verdict(step)

    def _verdict(self, step: int) -> None:
        """At a flush (every rank): whether the run has left its reference; the first departure into the
        manifest (``diverged``) and, unless ``keep_going``, ``RunDiverged`` on every rank."""
        assert self.live is not None
        departure = self.live.announce(self.run_dir, step=step, keep_going=self._keep_going)
        if departure is not None and not self._keep_going:
            raise RunDiverged(f"{self.run_dir}: {departure.summary()}; stopped after step {step}", departure)

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[TrainingRun]:
        """A validation pass inside a step: nothing it runs is recorded, and its time is not the step's.

            with run.evaluating():
                val_loss = evaluate(model)      # forward only, on held-out samples
            run.log(val_loss=val_loss)
        """
        if self._current is None:
            raise ArgumentError("evaluating() belongs inside `with run.step(step):`, after the optimizer step")
        start = time.perf_counter()
        with self.recorder.paused():
            yield self
        self._evaluation_s += time.perf_counter() - start

    def log(self, **values: Any) -> None:
        """The step's scalars this rank has (any of ``LOGGED``); tensors are read with ``float``."""
        if self._current is None:
            raise ArgumentError("log() belongs inside `with run.step(step):`")
        unknown = sorted(set(values) - set(LOGGED))
        if unknown:
            raise ArgumentError(f"log() takes {', '.join(LOGGED)}; not {', '.join(unknown)}")
        self._current.update({k: float(v) for k, v in values.items() if v is not None})

    def _flush_scalars(self, *, gather: bool) -> None:
        """Write the logged rows; with ``gather`` (every rank at the same steps), merged over ranks:
        a scalar comes from the lowest rank that logged it, the step time from rank 0."""
        rows, self._logged = self._logged, {}
        parts = all_gather_objects(rows) if gather else [rows]
        if self._scalars is None:
            return
        for step, own in rows.items():
            merged = dict(own)
            for other in parts[1:]:
                for key, value in other.get(step, {}).items():
                    if key not in ("step_time", "recorder_time", "tokens_per_s"):
                        merged.setdefault(key, value)
            row = {name: merged.get(name, 0 if name == "skipped" else math.nan) for name in layout.SCALAR_FIELDS}
            self._scalars.append(step, row)
            if self.live is not None:
                self.live.scalars(step, row)

    def close(self, error: BaseException | None = None) -> None:
        """End the run: ``complete``; with ``error``, ``failed`` (``interrupted`` for Ctrl-C) and no
        collective, since other ranks may never reach one: the per-site rows not yet reduced over
        ranks are lost then (a one-process run keeps them all)."""
        diverged = isinstance(error, RunDiverged)  # raised on every rank at one step: collectives are safe
        failed = error is not None and not diverged
        alone = not (dist.is_initialized() and dist.get_world_size() > 1)  # a flush needs no other rank
        try:
            self._flush_scalars(gather=not failed)
            self.recorder.close(flush=not failed or alone)
        finally:
            if self.probe is not None:
                self.probe.remove()
            self._stop_heartbeat.set()
            if self._heartbeat is not None:
                self._heartbeat.join()
            if self._scalars is not None:
                self._scalars.close()
                if error is None or diverged:
                    set_status(self.run_dir, layout.Status.DIVERGED if diverged else layout.Status.COMPLETE)
                else:
                    status = layout.Status.INTERRUPTED if isinstance(error, KeyboardInterrupt) else layout.Status.FAILED
                    excerpt = "".join(traceback.format_exception(error))[-2000:]
                    set_status(self.run_dir, status, error={"rank": self._rank, "message": f"{type(error).__name__}: "
                                                            f"{error}", "excerpt": excerpt})
            if self._lock is not None:
                self._lock.release()  # the next writer may come in once the status is written

    def __enter__(self) -> TrainingRun:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        self.close(error)


def record(run_dir: str | os.PathLike[str], chunks: Sequence[torch.nn.Module], optimizer: Any = None, *,
           steps: int, name: str | None = None, global_batch_size: int | None = None,
           user_config: Mapping[str, Any] | None = None, seed: int | None = None, deterministic: bool | None = None,
           record: RecordConfig | None = None, sites: SiteFilter | None = None, flush_every: int = 10,
           heartbeat_s: float = 30.0, against: str | os.PathLike[str] | None = None, rtol: float | None = None,
           keep_going: bool = False, producer: str = USER_LOOP, perturb: str | None = None,
           emulate: Sequence[str] = ()) -> TrainingRun:
    """Start recording a Megatron Core training into the run folder ``run_dir``; use it as a context manager
    around the loop (``with record(...) as run:``, then ``with run.step(step):`` and ``run.log(...)``). Every
    rank calls it, after ``parallel_state`` is initialised and the model and optimizer exist.

    ``chunks``: the model chunks (a list of ``GPTModel``, DDP-wrapped or not; one per virtual stage).
    ``optimizer``: the optimizer the loop steps (torch's or Megatron's, the distributed one included): the
    reduced gradients, the Adam moments and the updates are read through it; without it those kinds are
    named missing. ``steps``: the training steps the loop will run. ``name``: the run's name (default: the
    folder's). ``global_batch_size``: samples per step, for tokens/s. ``user_config``: any mapping (Megatron-LM's
    ``vars(args)``), stored with its hash. ``seed`` and ``deterministic``: stored in the manifest
    (``deterministic`` defaults to what Megatron's config and torch say). ``record``: which kinds, steps and
    snapshots to record (``RecordConfig``); ``sites``: a glob, a list of globs or a predicate over site ids.
    ``flush_every``: steps between writes to the store; ``heartbeat_s``: seconds between rank 0's heartbeats
    (how a reader on another host tells a live run from a dead one). ``against``: a live reference (a run
    folder or a golden file) that stops the run at its first divergence, within ``rtol`` if given (bitwise
    otherwise), or only reports it with ``keep_going``. ``producer``: the manifest's producer. ``perturb``: make
    this run a band run of the loop (``"fp32"``, ``"bf16"`` or ``"fp16"``): every module's output and its
    gradient get one rounding of that precision (``workbench.recorder.rounding``), and the manifest says so
    (``perturbation``); a few such runs are the band ``workbench verdict`` holds a layout or precision change to.
    ``emulate``: on the CPU, the nondeterminism sources to emulate (``workbench.determinism.SOURCES``:
    ``embedding_atomics``, ``attention_backward``, ``splitk_gemm``, ``dp_allreduce``, ``moe_token_combine``), each
    an accumulation order drawn from ``os.urandom`` as a GPU's would be; the manifest names them on and the run
    nondeterministic, so that repeats of the loop make a noise floor on a machine without a GPU.

    What it would record wrong is refused here, in one line, before anything is written; a folder another
    writer holds is refused naming it."""
    return TrainingRun(run_dir, chunks, optimizer, steps=steps, name=name, global_batch_size=global_batch_size,
                       user_config=user_config, seed=seed, deterministic=deterministic, record=record, sites=sites,
                       flush_every=flush_every, heartbeat_s=heartbeat_s, against=against, rtol=rtol,
                       keep_going=keep_going, producer=producer, perturb=perturb, emulate=emulate)

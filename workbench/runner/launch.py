"""Launching a run: one process per rank, a log per rank, progress, and no hung process groups.

``launch`` creates the run store with its manifest, starts ``tp x pp x dp`` worker
processes (gloo on CPU, NCCL on GPU; on the CPU forked by a zygote that has imported them already,
``workbench.runner.zygote``) with the determinism switches in their environment,
shows rank 0's progress, and watches every rank: if one fails, the others are stopped
(SIGTERM, then SIGKILL) and the failing rank's error is raised as ``LaunchError``.
Imports no torch: the launcher stays light and the workers do the training.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench import determinism, disk
from workbench.config import Precision, RunConfig
from workbench.disk import is_no_room, no_room
from workbench.errors import ArgumentError, CheckpointError, IncomparableRunsError, LaunchError, UnsupportedError
from workbench.runner import zygote as zygotes
from workbench.runner.rank_log import RANK_ERROR
from workbench.runner.zygote import ForkedRank
from workbench.store import layout
from workbench.store.manifest import parse_manifest, runner_manifest
from workbench.store.reader import open_run
from workbench.store.writer import create_store, set_status, update_manifest
from workbench.store.writer_lock import writing
from workbench.versions import check_megatron_core

ProgressFn = Callable[[str], None]
_POLL_S = 0.2
_GRACE_S = 5.0


@dataclass
class _Rank:
    rank: int
    process: subprocess.Popen[bytes] | ForkedRank
    log: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_PORT_TRIES = 3
"""Launches on one machine at once can race for a rendezvous port: ``_free_port`` frees the port it found
before rank 0 binds it (seen with two test suites side by side: ``EADDRINUSE`` in rank 0)."""


def _port_taken(ranks: list[_Rank]) -> bool:
    """True when the ranks failed because rank 0 could not bind the rendezvous port, before any step."""
    logs = [_log_text(rank.log) for rank in ranks]
    return "EADDRINUSE" in logs[0] and not any("PROGRESS " in log for log in logs)


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _threads_per_rank(world_size: int) -> int:
    return max(1, (os.cpu_count() or 1) // world_size)


def _spawn(cfg: RunConfig, paths: layout.RunPaths, args: list[str]) -> list[_Rank]:
    paths.logs.mkdir(parents=True, exist_ok=True)
    world = cfg.layout.world_size
    port = _free_port()
    on_gpu = _has_gpu()
    sources = cfg.source_states(on_gpu=True) if on_gpu else None  # no CPU kernel reads the variables
    ranks: list[_Rank] = []
    zygote = None
    if not on_gpu and zygotes.enabled():  # a CUDA context does not survive a fork
        try:
            zygote = zygotes.Zygote.shared(os.environ)
        except OSError:
            zygote = None
    for rank in range(world):
        env = determinism.rank_environment(cfg.deterministic, sources=sources)
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
        env.setdefault("OMP_NUM_THREADS", str(_threads_per_rank(world)))
        log = paths.rank_log(rank)
        argv = [str(paths.run_dir), *args]
        process: subprocess.Popen[bytes] | ForkedRank | None = None
        if zygote is not None:
            try:
                process = zygote.start(argv, env, log)
            except zygotes.ZygoteGone:  # started as its own process instead, as on a GPU
                zygote = None
        if process is None:
            with log.open("wb") as out:
                process = subprocess.Popen([sys.executable, "-m", "workbench.runner.worker", *argv],
                                           stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                           start_new_session=True)
        ranks.append(_Rank(rank, process, log))
    return ranks


def _stop(ranks: list[_Rank]) -> None:
    for r in ranks:
        if r.process.poll() is None:
            _signal_group(r, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    for r in ranks:
        try:
            r.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(r, signal.SIGKILL)
            r.process.wait()


def _signal_group(rank: _Rank, sig: signal.Signals) -> None:
    """Signal a rank's process group; one that ended since it was last polled is left be (a busy machine's run
    met that race: a rank that lost its peer exited between the poll and the signal)."""
    try:
        os.killpg(rank.process.pid, sig)
    except ProcessLookupError:
        pass


def error_excerpt(log: Path, lines: int = 25) -> str:
    """The end of a rank's log: its error line if the workbench raised it on purpose, else from its last
    traceback if it has one (torch prefixes a rank's lines with ``[rankR]:``)."""
    text = log.read_text(errors="replace").splitlines() if log.exists() else []
    said = [line for line in text if line.startswith(RANK_ERROR)]
    if said:
        return said[-1]
    starts = [i for i, line in enumerate(text) if _TRACEBACK in line]
    tail = text[starts[-1]:] if starts else text[-lines:]
    return "\n".join(tail[-lines:])


class _ProgressReader:
    """Follows rank 0's log and hands each new ``PROGRESS`` line to ``report``."""

    def __init__(self, log: Path, report: ProgressFn | None) -> None:
        self._log, self._report, self._offset = log, report, 0

    def poll(self) -> None:
        if self._report is None or not self._log.exists():
            return
        with self._log.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        for line in chunk[:end].decode(errors="replace").splitlines():
            if line.startswith("PROGRESS "):
                self._report(line.removeprefix("PROGRESS "))


_CONSEQUENTIAL = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing", "Broken pipe")
"""What a rank's error says when it failed because another rank did."""


_TRACEBACK = "Traceback (most recent call last)"
_PEER_WAIT_S = 15.0
"""How long the launcher waits for the other ranks to end on their own when the first rank to fail
only lost its peer."""


def _log_text(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


def _consequential(rank: _Rank) -> bool:
    """Whether a rank's error says it failed because another rank did."""
    return any(mark in error_excerpt(rank.log) for mark in _CONSEQUENTIAL)


def _root_cause(failed: list[_Rank]) -> _Rank:
    """The failed rank whose error is its own (not a lost peer), the lowest such; else the first."""
    own = [r for r in failed if not _consequential(r)]
    return (own or failed)[0]


def _watch(ranks: list[_Rank], progress: _ProgressReader) -> _Rank | None:
    """Wait for every rank; return the first that failed (the others stopped), else None."""
    try:
        while True:
            progress.poll()
            codes = [r.process.poll() for r in ranks]
            failed = [r for r, code in zip(ranks, codes) if code not in (None, 0)]
            if failed:
                if all(_consequential(r) for r in failed):
                    # Under load the rank that lost its peer may exit first, before the peer that failed has
                    # written its own error: give the others a moment to end on their own.
                    deadline = time.monotonic() + _PEER_WAIT_S
                    while time.monotonic() < deadline and any(r.process.poll() is None for r in ranks):
                        time.sleep(_POLL_S)
                _stop(ranks)
                crashed = [r for r in ranks if _TRACEBACK in (text := _log_text(r.log)) or RANK_ERROR in text]
                return _root_cause(crashed or failed)
            if all(code == 0 for code in codes):
                progress.poll()
                return None
            time.sleep(_POLL_S)
    except BaseException:
        _stop(ranks)
        raise


def start_checkpoint(source: str | os.PathLike[str], cfg: RunConfig) -> tuple[Path, dict[str, Any]]:
    """The checkpoint folder a run of ``cfg`` at another layout starts from, and the manifest record of it:
    ``source`` is a checkpoint folder (``RUN/checkpoints/step_K``) or a run folder (its latest checkpoint).
    The source run must have trained the same model the same way (``numerics_hash`` without the layout).
    Every file in it that a rank would unpickle is checked here (``untrusted.check_checkpoint_folder``), so a
    file that would run code is refused in one line before any rank starts."""
    from workbench.untrusted import check_checkpoint_folder

    path = Path(source)
    if (path / "checkpoints").is_dir():
        steps = layout.RunPaths(path).checkpoint_steps()
        if not steps:
            raise CheckpointError(f"{path}: no complete checkpoint to start from")
        path = layout.RunPaths(path).checkpoint(steps[-1])
    if not (path / layout.CHECKPOINT_META).is_file():
        raise CheckpointError(f"{path}: not a complete checkpoint (a folder RUN/checkpoints/step_K with meta.json, "
                              "or a run folder)")
    meta = layout.checkpoint_meta(path)
    source_run = open_run(path.parent.parent)
    if source_run.config.numerics_hash(layout=False) != cfg.numerics_hash(layout=False):
        raise CheckpointError(f"{path}: written by {source_run.name} ({source_run.config.summary()}), which trains "
                              f"differently from {cfg.name} ({cfg.summary()}) beyond the layout; a run starts from "
                              "another layout's checkpoint only with the same model, data and optimizer")
    step = meta["step"]
    if step >= cfg.steps:
        raise CheckpointError(f"{path}: step {step} is not before the run's last step ({cfg.steps})")
    check_checkpoint_folder(path)
    record = {"run": str(source_run.path), "run_id": source_run.run_id, "step": step, "layout": meta.get("layout"),
              "model_loaded_by": "megatron.core.dist_checkpointing"
              if (path / layout.MEGATRON_CHECKPOINT / "metadata.json").is_file() else "workbench (by name)"}
    return path, record


def launch(cfg: RunConfig, run_dir: str | os.PathLike[str], *, resume: bool = False, stop_after: int | None = None,
           overwrite: bool = False, progress: ProgressFn | None = None, trace_step: int | None = None,
           manifest: Mapping[str, Any] | None = None, start_from: str | os.PathLike[str] | None = None,
           against: str | os.PathLike[str] | None = None, rtol: float | None = None,
           keep_going: bool = False) -> Path:
    """Train ``cfg`` into the run folder ``run_dir``; return it. Raises ``LaunchError`` if a rank fails.

    ``against``: a reference (a run folder or a golden-values file) the run is compared with as it trains
    (``analysis.live``, within ``rtol`` if given): at the first flush that departs from it every rank stops,
    the store ends ``diverged`` and its manifest's ``diverged`` says where; with ``keep_going`` the verdict is
    recorded and the run trains on. A reference that cannot serve (another model, steps it lacks) is refused
    before anything is written.

    ``trace_step``: run that step under the operation tracer (``workbench.runner.tracer``).
    ``manifest``: fields added to the run's manifest before any rank starts.
    ``start_from``: a checkpoint of a run of the same config at another layout (``start_checkpoint``): the
    run starts at its step, from its state resharded to this layout (the CPU runner's checkpoints only).
    """
    check_megatron_core()  # a release outside the tested range: one line before anything is written
    disk.writable_caches(say=progress)  # a read-only home: the ranks build their kernels in a temporary folder
    paths = layout.RunPaths(Path(run_dir))
    if start_from is not None and resume:
        raise LaunchError("--resume continues this run's own checkpoints; --start-from starts from another "
                          "run's: pass one of them")
    start_args: list[str] = []
    start_record: dict[str, Any] | None = None
    if start_from is not None:
        checkpoint_dir, start_record = start_checkpoint(start_from, cfg)
        start_args = ["--start-from", str(checkpoint_dir)]
        # the store's recorded steps begin at the checkpoint's step (as a replay's), so that readers
        # see no gap before it; the ranges change no number (record is outside the numerics hash)
        first = start_record["step"]
        ranges = [[max(a, first), b] for a, b in cfg.record.ranges or [[0, cfg.steps]] if b > first]
        cfg = cfg.with_overrides({"record.ranges": ranges or [[first, cfg.steps]],
                                  "record.snapshot_steps": [k for k in cfg.record.snapshot_steps if k >= first]})
    if against is not None:
        _check_reference(cfg, Path(against), rtol)
    if not _has_gpu() and (conflicts := determinism.emulation_conflicts(cfg)):
        raise UnsupportedError(f"{cfg.name}: {conflicts[0]}")
    if cfg.precision is Precision.FP8:
        from workbench.runner.model import check_precision_supported  # imports torch: only for fp8

        check_precision_supported(cfg.precision, on_gpu=_has_gpu())
    with writing(paths.run_dir, writer="workbench run" + (" --resume" if resume else "")):
        if resume:
            existing = open_run(paths.run_dir)
            if existing.manifest.config_hash != cfg.numerics_hash():
                raise CheckpointError(f"{paths.run_dir}: the store was written with a different config "
                                      f"({existing.config.summary()}); resume needs the same config")
            if not paths.checkpoint_steps():
                raise CheckpointError(f"{paths.checkpoints}: no complete checkpoint to resume from "
                                      "(set checkpoint_every in the config)")
            from workbench.untrusted import check_checkpoint_folder

            latest = paths.checkpoint(paths.checkpoint_steps()[-1])
            layout.checkpoint_meta(latest)
            check_checkpoint_folder(latest)  # a file that would run code, or a damaged one: refused before any rank
            layout.remove_partial_files(paths.store)  # a write a signal cut short: the rename never came
            set_status(paths.run_dir, layout.Status.RUNNING,
                       launcher={"pid": os.getpid(), "host": socket.gethostname()})
        else:
            if layout.resolve_run_dir(paths.run_dir) is not None and not overwrite:
                raise ArgumentError(f"{paths.run_dir} already holds a run; pass --resume to continue it or "
                                  "--overwrite to start again")
            if overwrite:  # the workbench's own entries only; the lock this process holds stays
                layout.clear_run_folder(paths.run_dir)
            try:
                create_store(paths.run_dir, runner_manifest(cfg), cfg.steps)
            except OSError as err:  # a full disk before any rank: no half-made store stays
                shutil.rmtree(paths.store, ignore_errors=True)
                raise no_room(err, paths.store) if is_no_room(err) else err from None
        if manifest:
            update_manifest(paths.run_dir, **manifest)
        if start_record is not None:
            update_manifest(paths.run_dir, started_from=start_record, resumes=[start_record["step"]])
        args = start_args + (["--resume"] if resume else []) \
            + (["--stop-after", str(stop_after)] if stop_after is not None else []) \
            + (["--trace-step", str(trace_step)] if trace_step is not None else []) \
            + (["--against", str(Path(against).resolve())] if against is not None else []) \
            + (["--rtol", repr(rtol)] if against is not None and rtol is not None else []) \
            + (["--keep-going"] if against is not None and keep_going else [])
        for attempt in range(1, _PORT_TRIES + 1):
            ranks = _spawn(cfg, paths, args)
            try:
                failed = _watch(ranks, _ProgressReader(ranks[0].log, progress))
            finally:  # every rank has ended: what a signal cut short mid-write goes too
                layout.remove_partial_files(paths.store)
            if failed is None or attempt == _PORT_TRIES or not _port_taken(ranks):
                break
            if progress is not None:
                progress(f"the rendezvous port was taken by another process before rank 0 bound it; "
                         f"starting the ranks again on another (try {attempt + 1} of {_PORT_TRIES})")
        if failed is not None:
            excerpt = error_excerpt(failed.log)
            unrecorded = _record_status(paths, layout.Status.FAILED, error={
                "rank": failed.rank, "exit_code": failed.process.returncode, "log": str(failed.log),
                "excerpt": excerpt[-2000:]})
            saved = paths.checkpoint_steps()
            room = " No space was left on its disk." if "No space left on device" in excerpt else ""
            again = (f" Its latest checkpoint is step {saved[-1]}: after fixing the cause, --resume continues from "
                     "there." if saved else " It saved no checkpoint: after fixing the cause, --overwrite starts "
                     "it again.")
            raise LaunchError(f"rank {failed.rank} of {cfg.name} failed (exit code {failed.process.returncode}); "
                              f"all ranks stopped.{unrecorded}{room}{again} Its log: {failed.log}\n{excerpt}")
        stopped = stop_after is not None and stop_after < cfg.steps
        diverged = against is not None and not keep_going and open_run(paths.run_dir).attrs.get("diverged") is not None
        unrecorded = _record_status(paths, layout.Status.DIVERGED if diverged else
                                    layout.Status.STOPPED if stopped else layout.Status.COMPLETE)
        if unrecorded:
            raise LaunchError(f"{cfg.name} trained every step.{unrecorded}")
        return paths.run_dir


def _check_reference(cfg: RunConfig, against: Path, rtol: float | None) -> None:
    """``IncomparableRunsError`` with the reason where ``against`` cannot be this run's live reference."""
    from workbench.recorder.reference import load_reference

    reference = load_reference(against, rtol=rtol)
    planned = parse_manifest(runner_manifest(cfg), source=cfg.name)
    recorded = cfg.record.recorded_steps(cfg.steps) if cfg.record.enabled else []
    reason = reference.refusal(model=planned.model.shape() if planned.model else None, steps=range(cfg.steps),
                               recorded=recorded)
    if reason is not None:
        raise IncomparableRunsError(f"--against {against}: {reason}")


def _record_status(paths: layout.RunPaths, status: layout.Status, **fields: Any) -> str:
    """Write the run's final status; if even that fails (the disk is full), a sentence on the state the
    store is left in, else ''."""
    try:
        set_status(paths.run_dir, status, **fields)
    except OSError as err:
        return (f" The status {status!s} could not be written to {paths.store} ({err.strerror or err}): the store "
                "reads 'interrupted', with every flushed step readable.")
    return ""

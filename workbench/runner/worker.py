"""One rank of a training run: the Megatron Core pretraining loop.

Started by the launcher (``workbench.runner.launch``) once per rank, with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` in its environment:

    python -m workbench.runner.worker RUN_DIR [--resume | --start-from CHECKPOINT] [--stop-after K] [--trace-step K]

It reads the config from the run's manifest, builds the ``runner.trainer.Trainer`` for its place in
the TP x PP x DP grid, trains it step by step, and global rank 0 writes one row of scalars per step
into the store. Progress lines on stdout start with ``PROGRESS`` for the launcher to show. With ``--trace-step K``
step K runs under the operation tracer (``workbench.runner.tracer``) and the ranks of
data-parallel replica 0 write their traces into the run folder.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workbench import determinism, environment
from workbench.config import RunConfig
from workbench.errors import CheckpointError, CheckpointWriteError, WorkbenchError
from workbench.recorder.live import LiveCheck
from workbench.recorder.reference import load_reference
from workbench.runner import cpu_compat
from workbench.runner.rank_log import DIVERGED, RANK_ERROR
from workbench.runner.trainer import Trainer
from workbench.store import layout
from workbench.store.manifest import parse_layout
from workbench.store.reader import open_run
from workbench.store.writer import ScalarWriter, update_manifest

FAIL_AT_ENV = "WORKBENCH_FAIL_AT"
"""``RANK:STEP``: that rank raises at that step. For testing that a failing rank stops the run."""


def runtime_facts(device: torch.device) -> dict[str, Any]:
    """Where this rank runs: the device, the process group's backend, the CPU compatibility layer, and the
    environment's fingerprint (``workbench.environment.collect``)."""
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "backend": dist.get_backend(), "cuda": torch.version.cuda, "cpu_compat_layer": cpu_compat.is_installed(),
            **environment.collect(device=str(device), world_size=dist.get_world_size())}


def _check_injected_failure(rank: int, step: int) -> None:
    spec = os.environ.get(FAIL_AT_ENV)
    if spec and spec == f"{rank}:{step}":
        raise RuntimeError(f"injected failure on rank {rank} at step {step} ({FAIL_AT_ENV}={spec})")


def _exit_when_orphaned(poll_s: float = 1.0) -> None:
    """End this rank if its launcher dies (even by SIGKILL): no rank outlives its run."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(70)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def _traced_step(trainer: Trainer, step: int, paths: layout.RunPaths, rank: int) -> dict[str, float]:
    from workbench.runner.tracer import OpTracer

    with OpTracer(trainer.model.chunks, rank=rank, tp_rank=trainer.tp_rank) as tracer:
        row = trainer.train_step(step)
    if trainer.dp_rank == 0:
        tracer.write(paths.op_trace(step, rank))
    return row


def _last_flush(trainer: Trainer, writer: ScalarWriter | None) -> None:
    """Every recorded step onto disk before a failing run ends (collective: every rank calls it)."""
    if trainer.recorder is not None:
        trainer.recorder.close()
    if writer:
        writer.close()


def _departed(live: LiveCheck, step: int, row: dict[str, float], cfg: RunConfig, run_dir: Path, rank: int, *,
              keep_going: bool) -> bool:
    """After ``step``: its scalars to the reference (rank 0) and, at a flush, the verdict on every rank; the
    first departure goes into the manifest (``diverged``) and the log. Whether the run stops here."""
    if rank == 0:
        live.scalars(step, row)
    if live.announced or not ((step + 1) % cfg.flush_every == 0 or step == cfg.steps - 1):
        return False
    departure = live.announce(run_dir, step=step, keep_going=keep_going)
    if departure is None:
        return False
    if rank == 0:
        print(f"{DIVERGED}{departure.summary()}", flush=True)
    return not keep_going


def run(run_dir: Path, *, resume: bool, stop_after: int | None, trace_step: int | None = None,
        start_from: Path | None = None, against: Path | None = None, rtol: float | None = None,
        keep_going: bool = False) -> None:
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from workbench.runner import checkpoint

    _exit_when_orphaned()
    paths = layout.RunPaths(run_dir)
    run_store = open_run(run_dir)
    cfg, manifest = run_store.config, run_store.attrs
    rank = int(os.environ["RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        cpu_compat.install()
        device = torch.device("cpu")
    determinism.apply_in_process(cfg.deterministic, cfg.source_states(on_gpu=device.type == "cuda"))
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                            timeout=datetime.timedelta(minutes=10))
    ps.initialize_model_parallel(tensor_model_parallel_size=cfg.layout.tp,
                                 pipeline_model_parallel_size=cfg.layout.pp,
                                 virtual_pipeline_model_parallel_size=cfg.layout.vp if cfg.layout.vp > 1 else None,
                                 expert_model_parallel_size=cfg.layout.ep,
                                 expert_tensor_parallel_size=1 if cfg.model.is_moe else None)
    model_parallel_cuda_manual_seed(cfg.seed)
    live = None
    if against is not None:  # rank 0 compares; every rank learns the verdict at each flush
        live = LiveCheck(load_reference(against, rtol=rtol) if rank == 0 else None, rank=rank)
    trainer = Trainer(cfg, device, run_dir, live=live)

    start = 0
    if resume:
        start = checkpoint.latest_step(paths)
        meta = checkpoint.read_meta(paths, start)
        # compared as typed layouts: a checkpoint of a schema v1 run holds fewer layout keys
        layouts = [parse_layout(m.get("layout"), str(paths.checkpoint(start))) for m in (meta, manifest)]
        if layouts[0] != layouts[1] or meta.get("config_hash") != manifest["config_hash"]:
            raise CheckpointError(f"checkpoint {paths.checkpoint(start)} was written by a different config or layout "
                                  "than this run's; resume it with the config it was trained with, or start afresh")
        trainer.restore(checkpoint.load(paths, start))
    elif start_from is not None:  # another layout's checkpoint (the launcher checked that it fits)
        start = int(checkpoint.read_meta_at(start_from)["step"])
        trainer.start_from(checkpoint.load_full_state(start_from), start_from)
    if rank == 0:
        record = dict(manifest["determinism"])
        record.update(determinism.describe(cfg.deterministic, trainer.emulated, sources=trainer.sources,
                                           on_gpu=trainer.on_gpu))
        update_manifest(run_dir, runtime=runtime_facts(device), determinism=record, status=layout.Status.RUNNING,
                        resumes=[*manifest.get("resumes", []), start] if resume else manifest.get("resumes", []),
                        **({"perturbation": trainer.probe.describe()} if trainer.probe is not None else {}))
    writer = ScalarWriter(run_dir, cfg.flush_every) if rank == 0 else None
    meta = {"layout": manifest["layout"], "config_hash": manifest["config_hash"]}

    for step in range(start, cfg.steps + 1):
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and not (resume and step == start):
            if writer:
                writer.flush()
            try:
                checkpoint.save(paths, step, meta=meta, **trainer.state(),
                                megatron=trainer.model.gpts if cfg.checkpoint_format.value == "megatron" else None)
            except CheckpointWriteError as err:  # raised on every rank, the partial checkpoint already removed
                try:
                    _last_flush(trainer, writer)
                except Exception as flush_error:  # the disk is still full: say what is lost
                    raise CheckpointWriteError(f"{err}; the last flush failed too ({type(flush_error).__name__}: "
                                               f"{flush_error}), so the steps since the one before it are lost") \
                        from None
                raise
        if step == cfg.steps or (stop_after is not None and step >= stop_after):
            break
        _check_injected_failure(rank, step)
        row = _traced_step(trainer, step, paths, rank) if step == trace_step else trainer.train_step(step)
        row["val_loss"] = trainer.evaluate() if cfg.eval.after(step, cfg.steps) else math.nan
        if writer:
            writer.append(step, row)
            val = f" val_loss={row['val_loss']:.4f}" if math.isfinite(row["val_loss"]) else ""
            print(f"PROGRESS step={step + 1}/{cfg.steps} loss={row['loss']:.4f}{val} "
                  f"grad_norm={row['grad_norm']:.3f} lr={row['lr']:.2e} step_time={row['step_time']:.3f}s",
                  flush=True)
        if live is not None and _departed(live, step, row, cfg, run_dir, rank, keep_going=keep_going):
            break
    _last_flush(trainer, writer)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--trace-step", type=int, default=None)
    parser.add_argument("--start-from", type=Path, default=None)
    parser.add_argument("--against", type=Path, default=None)
    parser.add_argument("--rtol", type=float, default=None)
    parser.add_argument("--keep-going", action="store_true")
    args = parser.parse_args(argv)
    try:
        run(args.run_dir, resume=args.resume, stop_after=args.stop_after, trace_step=args.trace_step,
            start_from=args.start_from, against=args.against, rtol=args.rtol, keep_going=args.keep_going)
    except WorkbenchError as err:  # said on purpose: one line for the launcher to show, no traceback
        print(f"{RANK_ERROR}{err}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()

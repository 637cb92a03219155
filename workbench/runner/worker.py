"""One rank of a training run: the Megatron Core pretraining loop.

Started by the launcher (``workbench.runner.launch``) once per rank, with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` in its environment:

    python -m workbench.runner.worker RUN_DIR [--resume | --start-from CHECKPOINT] [--stop-after K] [--trace-step K]

It reads the config from the run's manifest, builds the model for its place in the
TP x PP x DP grid, trains with the schedule from ``get_forward_backward_func`` (1F1B when
PP > 1), and global rank 0 writes one row of scalars per step into the store. Progress
lines on stdout start with ``PROGRESS`` for the launcher to show. With ``--trace-step K``
step K runs under the operation tracer (``workbench.runner.tracer``) and the ranks of
data-parallel replica 0 write their traces into the run folder.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workbench import determinism
from workbench.config import RunConfig
from workbench.data import SyntheticCorpus, rank_held_out_microbatches, rank_microbatch_indices
from workbench.errors import CheckpointError, CheckpointWriteError, UnsupportedError, WorkbenchError
from workbench.runner import cpu_compat
from workbench.runner.launch import RANK_ERROR
from workbench.store import layout
from workbench.store.manifest import parse_layout
from workbench.store.reader import open_run
from workbench.store.writer import ScalarWriter, update_manifest

FAIL_AT_ENV = "WORKBENCH_FAIL_AT"
"""``RANK:STEP``: that rank raises at that step. For testing that a failing rank stops the run."""


class Trainer:
    """The state of one rank: model, optimizer, schedule, data; ``train_step`` runs one step."""

    def __init__(self, cfg: RunConfig, device: torch.device, run_dir: Path) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from workbench.recorder import Recorder
        from workbench.runner import faults, nondeterminism
        from workbench.runner.model import build_model, compute_dtype
        from workbench.runner.optimizer import build_optimizer, build_scheduler

        self.cfg, self.device = cfg, device
        self.on_gpu = device.type == "cuda"
        self.model = build_model(cfg, device)
        self.sources = cfg.source_states(on_gpu=self.on_gpu)
        self.emulated = [] if self.on_gpu else nondeterminism.install(self.model, self.sources)
        self.optimizer = build_optimizer(self.model, cfg, self.on_gpu)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        if cfg.precision.value == "fp16":
            self.model.config.grad_scale_func = self.optimizer.scale_loss
        self.forward_backward = get_forward_backward_func()
        self.corpus = SyntheticCorpus(vocab_size=cfg.model.vocab_size, seq_length=cfg.model.seq_length,
                                      seed=cfg.data.seed, branching=cfg.data.branching)
        self.dp_rank = ps.get_data_parallel_rank()
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        # Before the recorder, so that the recorder's hooks see the fault's result.
        self.fault = faults.attach(cfg.fault, self.model, dp_rank=self.dp_rank,
                                   compute_dtype=compute_dtype(cfg.precision))
        self.reports_loss = ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0
        s = cfg.model.seq_length
        self.position_ids = torch.arange(s, device=device).unsqueeze(0).expand(cfg.micro_batch_size, s)
        # An explicit causal mask (True = masked): Megatron's default one is built on "cuda".
        self.attention_mask = torch.ones(s, s, dtype=torch.bool, device=device).triu(1)[None, None]
        self.recorder = Recorder(
            self.model.chunks, run_dir=run_dir, total_steps=cfg.steps, optimizer=self.optimizer, record=cfg.record,
            precision=cfg.precision.value, global_batch_size=cfg.global_batch_size,
            flush_every=cfg.flush_every) if cfg.record.enabled else None
        # The model, optimizer and Megatron's state are alive for the whole run: out of the collector's
        # reach they are not traversed by every full collection (~10 % of a small model's step time).
        gc.freeze()

    def _microbatches(self, step: int) -> Iterator[tuple[int, torch.Tensor]]:
        """(position of its first sample in the global batch, tokens [mbs, seq + 1]) per micro-batch."""
        cfg = self.cfg
        for indices in rank_microbatch_indices(step, global_batch_size=cfg.global_batch_size,
                                               micro_batch_size=cfg.micro_batch_size, dp=cfg.layout.dp,
                                               dp_rank=self.dp_rank):
            yield int(indices[0]) - step * cfg.global_batch_size, \
                torch.from_numpy(self.corpus.samples(indices)).to(self.device)

    def _data_iterators(self, batches: Iterator[Any]) -> Any:
        """The schedule's data iterator: with virtual stages one per model chunk, each over the same batches."""
        if len(self.model.chunks) == 1:
            return batches
        return list(itertools.tee(batches, len(self.model.chunks)))

    def _forward_step(self, data_iterator: Iterator[tuple[int, torch.Tensor]], model: torch.nn.Module):  # type: ignore[no-untyped-def]
        first_sample, tokens = next(data_iterator)
        if self.recorder is not None:
            self.recorder.microbatch(first_sample)
        inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        output = model(inputs, self.position_ids, self.attention_mask, labels=labels)  # [mbs, seq] losses
        return output, partial(_mean_loss, labels.numel())

    def train_step(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        start = time.perf_counter()
        if self.fault is not None:
            self.fault.step = step
        for chunk in self.model.chunks:
            chunk.zero_grad_buffer()
        if self.recorder is not None:
            self.recorder.step_begin(step)
        self.scheduler.step(1)
        lr = float(self.optimizer.param_groups[0]["lr"])
        loss_scale = self.optimizer.loss_scale()
        losses = self.forward_backward(
            forward_step_func=self._forward_step, data_iterator=self._data_iterators(self._microbatches(step)),
            model=self.model.chunks, num_microbatches=cfg.num_microbatches, seq_length=cfg.model.seq_length,
            micro_batch_size=cfg.micro_batch_size, forward_only=False)
        updated, grad_norm = self.optimizer.step()
        recorder_time = self.recorder.step_end(step) if self.recorder is not None else 0.0
        loss = self._global_loss(losses)
        if self.on_gpu:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        return {"loss": loss, "grad_norm": grad_norm, "lr": lr, "loss_scale": loss_scale, "step_time": elapsed,
                "tokens_per_s": cfg.tokens_per_step / max(elapsed - recorder_time, 1e-9),
                "recorder_time": recorder_time, "skipped": 0.0 if updated else 1.0}

    @torch.no_grad()
    def evaluate(self) -> float:
        """The loss on the held-out samples, forward only (no gradient, no recorded site, no update)."""
        cfg = self.cfg
        batches = [torch.from_numpy(self.corpus.samples(indices)).to(self.device) for indices in
                   rank_held_out_microbatches(cfg.eval.samples, micro_batch_size=cfg.micro_batch_size,
                                              dp=cfg.layout.dp, dp_rank=self.dp_rank)]

        def forward_step(data_iterator: Iterator[torch.Tensor], model: torch.nn.Module):  # type: ignore[no-untyped-def]
            tokens = next(data_iterator)
            inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
            return model(inputs, self.position_ids, self.attention_mask, labels=labels), \
                partial(_mean_loss, labels.numel())

        for chunk in self.model.chunks:
            chunk.eval()
        try:
            losses = self.forward_backward(
                forward_step_func=forward_step, data_iterator=self._data_iterators(iter(batches)),
                model=self.model.chunks,
                num_microbatches=len(batches), seq_length=cfg.model.seq_length,
                micro_batch_size=cfg.micro_batch_size, forward_only=True)
        finally:
            for chunk in self.model.chunks:
                chunk.train()
        return self._global_loss(losses)

    def _global_loss(self, losses: list[dict[str, torch.Tensor]]) -> float:
        """Mean loss over the global batch, known on every rank (one all-reduce of one number)."""
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        if self.reports_loss:
            total[0] = sum(float(x["lm loss"]) for x in losses) / len(losses) / self.cfg.layout.dp
        dist.all_reduce(total)
        return float(total[0])

    def state(self) -> dict[str, Any]:
        return {"params": self.model.named_parameters(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict()}

    @torch.no_grad()
    def start_from(self, full: dict[str, Any], source: Path) -> None:
        """Take this rank's shards of another layout's checkpoint (``checkpoint.load_full_state``)."""
        from workbench.runner.checkpoint import has_megatron, load_megatron, shard_of

        if not hasattr(self.optimizer, "load_named_state"):
            raise UnsupportedError("starting from another layout's checkpoint needs the CPU runner's optimizer; "
                                   "Megatron's own (GPU runs) keeps its state by parameter group index")
        megatron = has_megatron(source)
        if megatron:  # the model resharded by Megatron's dist_checkpointing, the optimizer by name below
            load_megatron(source, self.model.gpts)
        named = {}
        for name, param in self.model.named_parameters():
            if name not in full["params"]:
                raise CheckpointError(f"{source}: holds no parameter {name!r} of this model")
            if not megatron:
                param.copy_(shard_of(full["params"][name], param))
            named[name] = {key: value if key == "step" else shard_of(value, param)
                           for key, value in full["optimizer_named"][name].items()}
        self.optimizer.load_named_state(named, full["optimizer"])
        self.scheduler.load_state_dict(full["scheduler"])

    @torch.no_grad()
    def restore(self, state: dict[str, Any]) -> None:
        for name, param in self.model.named_parameters():
            param.copy_(state["params"][name])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


def _mean_loss(num_tokens: int, output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = output.float().sum() / num_tokens
    # A copy: the schedule divides the returned loss in place by the number of micro-batches.
    return loss, {"lm loss": loss.detach().clone()}


def runtime_facts(device: torch.device) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "backend": dist.get_backend(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "cpu_compat_layer": cpu_compat.is_installed(),
    }
    if device.type == "cuda":
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return facts


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


def run(run_dir: Path, *, resume: bool, stop_after: int | None, trace_step: int | None = None,
        start_from: Path | None = None) -> None:
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
    trainer = Trainer(cfg, device, run_dir)

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
                        resumes=[*manifest.get("resumes", []), start] if resume else manifest.get("resumes", []))
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
    args = parser.parse_args(argv)
    try:
        run(args.run_dir, resume=args.resume, stop_after=args.stop_after, trace_step=args.trace_step,
            start_from=args.start_from)
    except WorkbenchError as err:  # said on purpose: one line for the launcher to show, no traceback
        print(f"{RANK_ERROR}{err}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()

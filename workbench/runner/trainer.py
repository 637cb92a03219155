"""The training loop of one rank: a Megatron Core GPT (``runner.model``) with DDP and its optimizer, one
step through ``get_forward_backward_func`` (1F1B when PP > 1), the held-out loss, and the state a checkpoint
holds. The worker process (``runner.worker``) builds one and drives it step by step:

    trainer = Trainer(cfg, device, run_dir)
    scalars = trainer.train_step(step)        # loss, grad_norm, lr, ... of the global batch
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workbench.config import RunConfig
from workbench.data import SyntheticCorpus, rank_held_out_microbatches, rank_microbatch_indices
from workbench.errors import CheckpointError
from workbench.recorder.live import LiveCheck


class Trainer:
    """The state of one rank: model, optimizer, schedule, data; ``train_step`` runs one step."""

    def __init__(self, cfg: RunConfig, device: torch.device, run_dir: Path, *, live: LiveCheck | None = None) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from workbench.recorder import Recorder, nondeterminism
        from workbench.recorder.rounding import RoundingProbe
        from workbench.runner import faults
        from workbench.runner.model import build_model, compute_dtype
        from workbench.runner.optimizer import build_optimizer, build_scheduler

        self.cfg, self.device = cfg, device
        self.on_gpu = device.type == "cuda"
        self.model = build_model(cfg, device)
        self.sources = cfg.source_states(on_gpu=self.on_gpu)
        self.emulated = [] if self.on_gpu else nondeterminism.install(self.model, self.sources)
        self.optimizer = build_optimizer(self.model, cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self.model.config.grad_scale_func = self.optimizer.scale_loss  # as Megatron-LM's loop (1.0 but in fp16)
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
            flush_every=cfg.flush_every, live=live) if cfg.record.enabled else None
        # After the recorder's hooks: it records what each module computed, and the next one gets the noise.
        self.probe = RoundingProbe(self.model.chunks, cfg.perturb) if cfg.perturb is not None else None
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
        self.optimizer.zero_grad()  # Megatron's optimizer points .grad at main_grad: unset before the backward
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
            self._gather_parameters()
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

    def _gather_parameters(self) -> None:
        """Under ``overlap_param_gather`` the parameters updated by other data-parallel ranks arrive in the next
        training forward's pre-hooks: what Megatron-LM's loop does before it evaluates or saves, gather them all
        now (the hooks stay on; the next step's gather then finds nothing new)."""
        if self.cfg.optim.overlap_param_gather:
            for chunk in self.model.chunks:
                chunk.disable_forward_pre_hook(param_sync=True)
                chunk.enable_forward_pre_hook()

    def state(self) -> dict[str, Any]:
        self._gather_parameters()
        return {"params": self.model.named_parameters(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict()}

    @torch.no_grad()
    def start_from(self, full: dict[str, Any], source: Path) -> None:
        """Take this rank's shards of another layout's checkpoint (``checkpoint.load_full_state``)."""
        from workbench.runner.checkpoint import has_megatron, load_megatron, shard_of

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
        self.optimizer.load_named_state(named, full["optimizer"]["scalers"])
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

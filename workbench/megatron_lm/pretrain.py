"""Recording Megatron-LM's own training loop (``pretrain()``), without editing Megatron-LM.

``pretrain()`` passes every iteration through one call, ``train()``'s ``train_step(forward_step_func,
data_iterator, model, optimizer, opt_param_scheduler, config, forward_backward_func, iteration=...)``, which
``train()`` looks up as a global of ``megatron.training.training``. ``PretrainRecording.install`` puts a
wrapper there (the same in megatron-core 0.17, 0.18 and 0.19, whatever ``pretrain()``'s own signature):

* at the first call, ``workbench.recorder.record`` over the call's model chunks and optimizer, for
  ``--train-iters`` steps, with Megatron-LM's arguments as the run's ``user_config``;
* around each call, ``run.step(iteration)``: the hooks record every site of the forward, the backward, the
  reduction and the optimizer step; then the scalars from ``train_step``'s return value (the loss dict, the
  grad norm, whether the iteration was skipped) and from the optimizer (learning rate, loss scale);
* after the last iteration, the run is closed (every rank is there: the final reduction is safe).

The launcher (``python -m workbench.megatron_lm``) installs it before the entry script runs.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from workbench.recorder.session import TrainingRun, record
from workbench.store.manifest import MEGATRON_LM_PRETRAIN


class PretrainRecording:
    """One ``pretrain()`` recorded into ``run_dir``."""

    def __init__(self, run_dir: str | Path, *, flush_every: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.flush_every = flush_every
        self.run: TrainingRun | None = None
        self.closed = False

    def install(self) -> None:
        from megatron.training import training

        original = training.train_step
        signature = inspect.signature(original)

        def train_step(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind_partial(*args, **kwargs).arguments
            run, iteration = self._open(bound), self._iteration(bound)
            if run is None or self.closed:
                return original(*args, **kwargs)
            with run.step(iteration):
                result = original(*args, **kwargs)
                self._log(run, result, bound["optimizer"])
            if iteration + 1 >= self._train_iters():
                self.close()
            return result

        training.train_step = train_step

    def _open(self, bound: dict[str, Any]) -> TrainingRun | None:
        if self.run is None and not self.closed:
            from megatron.training import get_args

            args = get_args()
            options: dict[str, Any] = {"global_batch_size": args.global_batch_size, "seed": args.seed,
                                       "user_config": _json_safe(vars(args)), "producer": MEGATRON_LM_PRETRAIN}
            if self.flush_every:
                options["flush_every"] = self.flush_every
            self.run = record(self.run_dir, list(bound["model"]), bound["optimizer"], steps=self._train_iters(),
                              **options)
        return self.run

    @staticmethod
    def _iteration(bound: dict[str, Any]) -> int:
        iteration = bound.get("iteration")
        if iteration is None:  # a train_step without the argument: train() keeps it in args
            from megatron.training import get_args

            iteration = get_args().curr_iteration
        return int(iteration)

    @staticmethod
    def _train_iters() -> int:
        from megatron.training import get_args

        return int(get_args().train_iters)

    @staticmethod
    def _log(run: TrainingRun, result: Any, optimizer: Any) -> None:
        losses, skipped = (result[0], result[1]) if isinstance(result, tuple) and len(result) >= 2 else ({}, 0)
        grad_norm = result[5] if isinstance(result, tuple) and len(result) >= 6 else None
        loss = next((v for k, v in (losses or {}).items() if "loss" in k), None)
        groups = getattr(optimizer, "param_groups", None) or [{}]
        scale = optimizer.get_loss_scale() if hasattr(optimizer, "get_loss_scale") else None
        run.log(loss=_number(loss), grad_norm=_number(grad_norm), lr=_number(groups[0].get("lr")),
                loss_scale=_number(scale), skipped=int(bool(skipped)))

    def close(self, error: BaseException | None = None) -> None:
        """End the run (``complete``; with ``error``, ``failed``): after the last iteration, or when the entry
        script returns or fails first."""
        if self.run is not None and not self.closed:
            self.closed = True
            self.run.close(error)


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _json_safe(values: dict[str, Any]) -> dict[str, Any]:
    """Megatron-LM's arguments that JSON can hold (the rest as their text)."""
    safe: dict[str, Any] = {}
    for key, value in values.items():
        try:
            json.dumps(value)
            safe[key] = value
        except (TypeError, ValueError):
            safe[key] = repr(value)[:200]
    return safe

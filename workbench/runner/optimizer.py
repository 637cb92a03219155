"""The optimizer: Megatron's on GPU; on CPU an AdamW over fp32 master weights that behaves the same.

Megatron's mixed-precision optimizers check for CUDA tensor types, so on CPU this module
does what ``Float16OptimizerWithFloat16Params`` / ``FP32Optimizer`` do: read the reduced
gradients from Megatron DDP's ``main_grad`` buffers, unscale them and skip the step on
overflow (fp16, Megatron's ``DynamicGradScaler``), clip by the global L2 norm over
non-duplicated parameters (all-reduced over the model-parallel group), update fp32
master weights with ``torch.optim.AdamW`` and copy them back into the model's dtype.
Both optimizers answer ``step() -> (updated, grad_norm)``.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.optimizer.grad_scaler import DynamicGradScaler
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from workbench.config import OptimConfig, Precision, RunConfig
from workbench.recorder.targets import is_expert_parameter
from workbench.runner.model import BuiltModel


class TrainingOptimizer(Protocol):
    @property
    def param_groups(self) -> list[dict[str, Any]]: ...

    def step(self) -> tuple[bool, float]: ...
    def loss_scale(self) -> float: ...
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def adam_order(names: list[str], ndims: list[int]) -> list[str]:
    """The names in the order of the inner AdamW's state indices: decayed matrices first, then the rest."""
    return [n for n, d in zip(names, ndims) if d >= 2] + [n for n, d in zip(names, ndims) if d < 2]


def _is_duplicate(param: torch.Tensor) -> bool:
    """True for a tensor-parallel replica that another TP rank also counts in the norm."""
    return not getattr(param, "tensor_model_parallel", False) and ps.get_tensor_model_parallel_rank() > 0


class MasterWeightAdamW:
    """AdamW over fp32 master copies of the model's parameters, reading DDP's ``main_grad``."""

    def __init__(self, model: BuiltModel, optim: OptimConfig, precision: Precision) -> None:
        self._names, self._params = zip(*model.named_parameters(), strict=True)
        # fp32 parameters are their own master copy, as in Megatron's FP32Optimizer.
        self._masters = [p if p.dtype == torch.float32 else p.detach().float().clone() for p in self._params]
        decay = [m for p, m in zip(self._params, self._masters) if p.ndim >= 2]
        no_decay = [m for p, m in zip(self._params, self._masters) if p.ndim < 2]
        self._inner = torch.optim.AdamW(
            [{"params": decay, "weight_decay": optim.weight_decay, "wd_mult": 1.0},
             {"params": no_decay, "weight_decay": 0.0, "wd_mult": 0.0}],
            lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps, foreach=False)
        self._clip = optim.clip_grad
        self._has_experts = any(is_expert_parameter(p) for p in self._params)
        self._scaler = (DynamicGradScaler(initial_scale=optim.initial_loss_scale, min_scale=1.0,
                                          growth_factor=2.0, backoff_factor=0.5,
                                          growth_interval=optim.loss_scale_window, hysteresis=2)
                        if precision is Precision.FP16 else None)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        # Forwarded, not copied: load_state_dict replaces the inner optimizer's group dicts.
        return self._inner.param_groups

    def loss_scale(self) -> float:
        return float(self._scaler.scale.item()) if self._scaler else 1.0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.loss_scale()

    @torch.no_grad()
    def step(self) -> tuple[bool, float]:
        grads = [p.main_grad.float() for p in self._params]  # fp32 views of the reduced gradients
        if self._scaler is not None:
            inv = 1.0 / self.loss_scale()
            grads = [g * inv for g in grads]
            found = torch.tensor([float(any(not torch.isfinite(g).all() for g in grads))])
            # with experts, an overflow in one expert-parallel rank's experts must skip the step everywhere
            dist.all_reduce(found, op=dist.ReduceOp.MAX,
                            group=None if self._has_experts else ps.get_model_parallel_group())
            self._scaler.update(bool(found.item()))
            if found.item():
                return False, math.nan
        norm = self._global_norm(grads)
        coeff = self._clip / (norm + 1.0e-6)  # Megatron's clip_grad_by_total_norm_fp32
        for master, grad in zip(self._masters, grads):
            master.grad = grad * coeff if self._clip > 0 and coeff < 1.0 else grad
        self._inner.step()
        for param, master in zip(self._params, self._masters):
            master.grad = None
            if param is not master:
                param.copy_(master)
        return True, norm

    def _global_norm(self, grads: list[torch.Tensor]) -> float:
        """The L2 norm of the whole model's gradient: dense parameters summed over the model-parallel group,
        experts (each held by one rank of an expert-parallel group) over the expert model-parallel group."""
        dense = torch.zeros((), dtype=torch.float64)
        experts = torch.zeros((), dtype=torch.float64)
        for param, grad in zip(self._params, grads):
            if is_expert_parameter(param):  # expert TP size is 1 in this runner: no replicas to skip
                experts += grad.double().square().sum()
            elif not _is_duplicate(param):
                dense += grad.double().square().sum()
        dist.all_reduce(dense, group=ps.get_model_parallel_group())
        if self._has_experts:
            dist.all_reduce(experts, group=ps.get_expert_tensor_model_pipeline_parallel_group())
            dense += experts
        return float(dense.sqrt())

    def moments(self) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        """(canonical name, exp_avg, exp_avg_sq) of every parameter that has AdamW state."""
        found = []
        for name, master in zip(self._names, self._masters):
            state = self._inner.state.get(master)
            if state and "exp_avg" in state:
                found.append((name, state["exp_avg"], state["exp_avg_sq"]))
        return found

    def state_dict(self) -> dict[str, Any]:
        inner = self._inner.state_dict()
        return {
            "names": list(self._names),
            "masters": {n: m.detach().clone() for n, m in zip(self._names, self._masters)},
            "adam_state": inner["state"],
            "param_groups": inner["param_groups"],
            "scaler": self._scaler.state_dict() if self._scaler else None,
        }

    @torch.no_grad()
    def load_named_state(self, named: dict[str, dict[str, torch.Tensor]], state: dict[str, Any]) -> None:
        """Load per-name masters and moments (this rank's shards of another layout's checkpoint); the
        hyper-parameters and loss scaler from that checkpoint's optimizer ``state``."""
        order = adam_order(list(self._names), [p.ndim for p in self._params])
        adam = {i: {k: named[n][k] for k in ("step", "exp_avg", "exp_avg_sq")} for i, n in enumerate(order)
                if "exp_avg" in named[n]}
        groups = self._inner.state_dict()["param_groups"]
        groups = [{**theirs, "params": ours["params"]} for ours, theirs in zip(groups, state["param_groups"])]
        self.load_state_dict({"names": list(self._names), "masters": {n: named[n]["master"] for n in self._names},
                              "adam_state": adam, "param_groups": groups, "scaler": state["scaler"]})

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["names"]) != list(self._names):
            raise ValueError("checkpoint parameters do not match this model's parameters")
        for name, master in zip(self._names, self._masters):
            master.copy_(state["masters"][name])
        self._inner.load_state_dict({"state": state["adam_state"], "param_groups": state["param_groups"]})
        if self._scaler is not None and state["scaler"] is not None:
            self._scaler.load_state_dict(state["scaler"])


class MegatronOptimizerAdapter:
    """Megatron's own optimizer (GPU), behind the same small interface; ``wrapped`` is Megatron's optimizer
    itself (the recorder reads its Adam moments there)."""

    def __init__(self, model: BuiltModel, cfg: RunConfig) -> None:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        o = cfg.optim
        config = OptimizerConfig(
            optimizer="adam", lr=o.lr, min_lr=o.min_lr, weight_decay=o.weight_decay, adam_beta1=o.beta1,
            adam_beta2=o.beta2, adam_eps=o.eps, clip_grad=o.clip_grad,
            bf16=cfg.precision in (Precision.BF16, Precision.FP8), fp16=cfg.precision is Precision.FP16,
            initial_loss_scale=o.initial_loss_scale, loss_scale_window=o.loss_scale_window, hysteresis=2,
            use_distributed_optimizer=False)
        self.wrapped = get_megatron_optimizer(config, model.chunks)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.wrapped.param_groups

    def loss_scale(self) -> float:
        return float(self.wrapped.get_loss_scale().item())

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.wrapped.scale_loss(loss)

    def step(self) -> tuple[bool, float]:
        updated, norm, _ = self.wrapped.step()
        return bool(updated), float(norm) if norm is not None else math.nan

    def state_dict(self) -> dict[str, Any]:
        return self.wrapped.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.wrapped.load_state_dict(state)


def build_optimizer(model: BuiltModel, cfg: RunConfig, on_gpu: bool) -> TrainingOptimizer:
    if on_gpu:
        return MegatronOptimizerAdapter(model, cfg)
    return MasterWeightAdamW(model, cfg.optim, cfg.precision)


def build_scheduler(optimizer: TrainingOptimizer, cfg: RunConfig) -> OptimizerParamScheduler:
    """Megatron's warm-up + cosine schedule, stepped once per optimizer step."""
    o = cfg.optim
    warmup = min(o.warmup_steps, max(cfg.steps - 1, 0))
    return OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=o.lr, min_lr=o.min_lr, lr_warmup_steps=warmup,
        lr_decay_steps=max(cfg.steps, warmup + 1), lr_decay_style="cosine", start_wd=o.weight_decay,
        end_wd=o.weight_decay, wd_incr_steps=max(cfg.steps, 1), wd_incr_style="constant")

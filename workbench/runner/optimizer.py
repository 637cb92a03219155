"""The optimizer: Megatron's own (``get_megatron_optimizer``) on every device, and its state by parameter name.

On a GPU and on the CPU (``runner.cpu_compat`` maps its CUDA-only call sites) the runner trains with what
Megatron-LM trains with: Adam with decoupled weight decay (no decay on biases and norms), its fp32 optimizer,
its mixed-precision optimizer over fp32 main parameters (bf16, fp16 with its dynamic loss scaler), gradient
clipping by the global norm, and, with ``optim.use_distributed_optimizer``, its distributed optimizer (each
data-parallel rank keeps the main parameters and Adam moments of its own shard).

A checkpoint keeps that state by parameter name, each the whole tensor of this rank's tensor-parallel shard
(``named_state``): the distributed optimizer's shards are joined over its data-parallel group first. So a
checkpoint does not depend on the data-parallel size or on whether the optimizer was distributed, and a run of
another layout starts from it (``checkpoint.load_full_state``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from workbench.config import Precision, RunConfig
from workbench.errors import CheckpointError
from workbench.recorder.targets import distributed_optimizers, optimizers
from workbench.runner.model import BuiltModel

STATE_FORMAT = "megatron-by-name"
"""The ``format`` of a checkpoint's optimizer entry (``MegatronOptimizer.state_dict``)."""
MOMENTS = ("exp_avg", "exp_avg_sq")


class MegatronOptimizer:
    """Megatron's optimizer for the runner's model; ``wrapped`` is Megatron's optimizer itself (the recorder
    reads the Adam moments and the distributed optimizer's shards there)."""

    def __init__(self, model: BuiltModel, cfg: RunConfig) -> None:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        o = cfg.optim
        config = OptimizerConfig(
            optimizer="adam", lr=o.lr, min_lr=o.min_lr, weight_decay=o.weight_decay, adam_beta1=o.beta1,
            adam_beta2=o.beta2, adam_eps=o.eps, clip_grad=o.clip_grad,
            bf16=cfg.precision in (Precision.BF16, Precision.FP8), fp16=cfg.precision is Precision.FP16,
            initial_loss_scale=o.initial_loss_scale, loss_scale_window=o.loss_scale_window, hysteresis=2,
            use_distributed_optimizer=o.use_distributed_optimizer)
        self.wrapped = get_megatron_optimizer(config, model.chunks)
        self._named = model.named_parameters()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.wrapped.param_groups  # type: ignore[no-any-return]

    def loss_scale(self) -> float:
        return float(self.wrapped.get_loss_scale().item())

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.wrapped.scale_loss(loss)  # type: ignore[no-any-return]

    def zero_grad(self) -> None:
        self.wrapped.zero_grad()

    def step(self) -> tuple[bool, float]:
        updated, norm, _ = self.wrapped.step()
        return bool(updated), float(norm) if norm is not None else math.nan

    def _scalers(self) -> list[Any]:
        return [part.grad_scaler for part in optimizers(self.wrapped) if getattr(part, "grad_scaler", None)]

    def _entries(self) -> Iterator[tuple[str, torch.nn.Parameter, Any, torch.Tensor | None, tuple[int, int] | None]]:
        """(name, model parameter, the optimizer part training it, its main parameter, span) of every parameter
        the optimizer trains. Under the distributed optimizer ``span`` is the flat range of the parameter that
        this rank owns ((0, 0) and no main parameter when it owns none), in the order of the part's buffers,
        the same on every rank of its data-parallel group; otherwise None (all of it)."""
        names = {id(param): name for name, param in self._named}
        sharded = distributed_optimizers(self.wrapped)
        for part in sharded:
            for buffer in part.buffers:
                for param in buffer.params:
                    if param not in part.model_param_group_index_map:
                        yield names[id(param)], param, part, None, (0, 0)
                        continue
                    group, order = part.model_param_group_index_map[param]
                    found = part._get_model_param_range_map(param)["param"]
                    yield names[id(param)], param, part, part.optimizer.param_groups[group]["params"][order], \
                        (int(found.start), int(found.end))
        masters: dict[int, tuple[Any, torch.Tensor]] = {}
        for part in optimizers(self.wrapped):
            if part in sharded:
                continue
            for model_group, main_group in zip(getattr(part, "float16_groups", []),
                                               getattr(part, "fp32_from_float16_groups", [])):
                masters.update({id(p): (part, m) for p, m in zip(model_group, main_group)})
            for group in getattr(part, "optimizer", part).param_groups:  # fp32 parameters: their own main copy
                masters.update({id(p): (part, p) for p in group["params"] if id(p) not in masters})
        for name, param in self._named:
            if id(param) in masters:
                part, main = masters[id(param)]
                yield name, param, part, main, None

    @torch.no_grad()
    def named_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Per parameter name: ``master`` (the fp32 main parameter) and, once a step was taken, ``step``,
        ``exp_avg`` and ``exp_avg_sq``, each the whole tensor of this rank's tensor-parallel shard
        (collective over the data-parallel group under the distributed optimizer)."""
        named: dict[str, dict[str, torch.Tensor]] = {}
        shards: dict[Any, list[tuple[str, torch.nn.Parameter, dict[str, Any], tuple[int, int]]]] = {}
        for name, param, part, main, span in self._entries():
            inner = getattr(part, "optimizer", part)
            state = inner.state.get(main, {}) if main is not None else {}
            tensors = {"master": main, **{key: state[key] for key in MOMENTS if key in state}}
            if "exp_avg" in tensors:  # torch's Adam counts steps per parameter, TE's FusedAdam per group
                step = state.get("step", next((g.get("step") for g in inner.param_groups
                                               if any(p is main for p in g["params"])), None))
                tensors["step"] = torch.tensor(float(step if step is not None else 0), dtype=torch.float32)
            if span is None:
                named[name] = {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}
            else:
                shards.setdefault(part, []).append((name, param, tensors, span))
        for part, entries in shards.items():
            named.update(_join_shards(part.data_parallel_group, entries))
        return named

    @torch.no_grad()
    def load_named_state(self, named: dict[str, dict[str, torch.Tensor]], scalers: list[dict[str, Any]]) -> None:
        """Load ``named_state``'s tensors (of this rank's tensor-parallel shard) and the loss scalers' state."""
        for name, _, part, main, span in self._entries():
            if name not in named or "master" not in named[name]:
                raise CheckpointError(f"the checkpoint holds no optimizer state of parameter {name!r}")
            if main is None:  # another data-parallel rank owns all of it
                continue
            entry = named[name]
            main.copy_(_piece(entry["master"], span, main))
            if "exp_avg" in entry:
                inner = getattr(part, "optimizer", part)
                moments = {key: _piece(entry[key], span, main).to(main.device, main.dtype, copy=True)
                           for key in MOMENTS}
                if type(inner).__module__.startswith("torch.optim"):  # its step count: a CPU tensor per parameter
                    inner.state[main] = {"step": entry["step"].detach().to("cpu", torch.float32, copy=True),
                                         **moments}
                else:  # TE's FusedAdam and others: the step count in the parameter's group
                    inner.state[main] = moments
                    for group in inner.param_groups:
                        if any(p is main for p in group["params"]):
                            group["step"] = int(entry["step"])
        mine = self._scalers()
        if len(scalers) != len(mine):
            raise CheckpointError(f"the checkpoint holds {len(scalers)} loss scalers, this run's optimizer "
                                  f"{len(mine)} (fp16 runs keep one)")
        for scaler, state in zip(mine, scalers):
            scaler.load_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        named = self.named_state()
        return {"format": STATE_FORMAT, "masters": {n: s["master"] for n, s in named.items()},
                "moments": {n: {k: s[k] for k in ("step", *MOMENTS)} for n, s in named.items() if "exp_avg" in s},
                "scalers": [scaler.state_dict() for scaler in self._scalers()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state_format(state, "the checkpoint")
        named = {n: {"master": m, **state["moments"].get(n, {})} for n, m in state["masters"].items()}
        self.load_named_state(named, state["scalers"])


def _piece(tensor: torch.Tensor, span: tuple[int, int] | None, main: torch.Tensor) -> torch.Tensor:
    """The part of a whole parameter's ``tensor`` that ``main`` holds: its flat ``span``, or all of it."""
    flat = tensor.reshape(-1)
    return (flat if span is None else flat[span[0]:span[1]]).view(main.shape)


def check_state_format(state: Any, where: str) -> None:
    """``CheckpointError`` in one line unless ``state`` is an optimizer entry that ``MegatronOptimizer`` wrote."""
    if isinstance(state, dict) and state.get("format") == STATE_FORMAT and all(
            isinstance(state.get(key), kind) for key, kind in (("masters", dict), ("moments", dict),
                                                               ("scalers", list))):
        return
    if isinstance(state, dict) and "adam_state" in state:
        raise CheckpointError(f"{where}: its optimizer state was written by the workbench's former CPU optimizer "
                              "(an AdamW of its own, before runs trained with Megatron's optimizer); it cannot "
                              "continue a run of Megatron's optimizer: train the run again")
    raise CheckpointError(f"{where}: holds no optimizer state by parameter name (format {STATE_FORMAT!r}); "
                          "it was not written by this version of the workbench: train the run again")


def _join_shards(group: Any, entries: list[tuple[str, torch.nn.Parameter, dict[str, Any], tuple[int, int]]]
                 ) -> dict[str, dict[str, torch.Tensor]]:
    """The whole parameters' tensors from each data-parallel rank's shards: each rank writes the bits of its
    own ranges into zeros and one integer sum over the group joins them (exact: every element has one owner).
    The step count is the same for every parameter: the largest any rank holds (0 before the first step)."""
    device = entries[0][1].device  # the collective's: the GPU's under NCCL
    steps = [float(tensors["step"]) for _, _, tensors, _ in entries if "step" in tensors]
    step = torch.tensor([max(steps, default=0.0)], dtype=torch.float64, device=device)
    dist.all_reduce(step, op=dist.ReduceOp.MAX, group=group)
    keys = ("master", *MOMENTS) if step.item() > 0 else ("master",)
    sizes = [param.numel() for _, param, _, _ in entries]
    flat = torch.zeros(len(keys), sum(sizes), dtype=torch.int32, device=device)
    offset = 0
    for (name, _, tensors, (start, end)), size in zip(entries, sizes):
        if end > start:
            for row, key in enumerate(keys):
                if key not in tensors:
                    raise RuntimeError(f"the distributed optimizer holds no {key} of its shard of {name}")
                flat[row, offset + start:offset + end] = tensors[key].detach().float().reshape(-1).view(torch.int32)
        offset += size
    dist.all_reduce(flat, group=group)
    flat = flat.cpu()
    joined: dict[str, dict[str, torch.Tensor]] = {}
    offset = 0
    for (name, param, _, _), size in zip(entries, sizes):
        joined[name] = {key: flat[row, offset:offset + size].view(torch.float32).view(param.shape).clone()
                        for row, key in enumerate(keys)}
        if step.item() > 0:
            joined[name]["step"] = torch.tensor(step.item(), dtype=torch.float32)
        offset += size
    return joined


def build_optimizer(model: BuiltModel, cfg: RunConfig) -> MegatronOptimizer:
    return MegatronOptimizer(model, cfg)


def build_scheduler(optimizer: MegatronOptimizer, cfg: RunConfig) -> OptimizerParamScheduler:
    """Megatron's warm-up + cosine schedule, stepped once per optimizer step."""
    o = cfg.optim
    warmup = min(o.warmup_steps, max(cfg.steps - 1, 0))
    return OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=o.lr, min_lr=o.min_lr, lr_warmup_steps=warmup,
        lr_decay_steps=max(cfg.steps, warmup + 1), lr_decay_style="cosine", start_wd=o.weight_decay,
        end_wd=o.weight_decay, wd_incr_steps=max(cfg.steps, 1), wd_incr_style="constant")

"""Faults injected on purpose: a bit flip or a scaling in one site at one step, or a layout bug.

A known cause makes anomaly detection, replay and bisect testable: the config's
``fault`` section names the site and the step, the manifest says so, and the run is
otherwise an ordinary run (deterministic runs with a fault are still bitwise
reproducible: the fault is part of the config).

* ``act:<module>``: the module's ``forward`` is wrapped, so the change happens inside the
  module (an operation trace finds it there) and every hook, including the recorder's,
  sees the changed output. Only the first micro-batch of the step on data-parallel rank 0
  is hit; on every tensor-parallel rank the same local element is changed.
* ``grad:<parameter>``: applied to the reduced gradient (Megatron DDP's ``main_grad``) right
  after ``finalize_model_grads``, before the recorder's ``grad`` site and the optimizer.
* a layout bug (``kind = "layout_bug"``, ``config.LAYOUT_BUGS``): a tensor-parallel mistake on one rank or one
  parameter, in place from step 0 on: the bug-or-rounding corpus.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from workbench.config import FaultConfig, FaultKind
from workbench.errors import ConfigError
from workbench.runner.model import BuiltModel
from workbench.sites import split_site

_WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _check_bit(fault: FaultConfig, dtype: torch.dtype) -> None:
    width = torch.empty(0, dtype=dtype).element_size() * 8
    if fault.kind is FaultKind.BITFLIP and fault.bit >= width:
        raise ConfigError(f"fault.bit = {fault.bit} does not exist in a {width}-bit {dtype} element of {fault.site}")


def _changed(values: torch.Tensor, fault: FaultConfig) -> torch.Tensor:
    """A copy of ``values`` with the fault applied. Gradients still flow through it: a scaling is
    differentiated as one, and a flipped bit is a change made under ``no_grad`` to an
    autograd-tracked copy, so the element's gradient passes through unchanged."""
    if fault.kind is FaultKind.SCALE:
        return values * fault.factor
    flat = values.reshape(-1)
    if fault.index >= flat.numel():
        raise ConfigError(f"fault.index = {fault.index} is outside {fault.site} ({flat.numel()} elements here)")
    _check_bit(fault, values.dtype)
    out = values.clone()
    with torch.no_grad():
        word = flat[fault.index:fault.index + 1].clone().view(_WORDS[values.element_size()])
        mask = torch.tensor(1 << fault.bit, dtype=torch.int64).to(word.dtype)  # wraps to the sign bit for bit 31
        out.view(-1)[fault.index] = torch.bitwise_xor(word, mask).view(values.dtype)[0]
    return out


class FaultInjector:
    """Applies ``fault`` to ``model`` at ``fault.step``; ``step`` must be set before each step."""

    def __init__(self, fault: FaultConfig, model: BuiltModel, *, dp_rank: int, compute_dtype: torch.dtype) -> None:
        self.fault = fault
        self.present = False
        self.step = -1
        self.applied = 0
        self._dp_rank = dp_rank
        self._last_hit_step = -1
        kind, name = split_site(fault.site)
        if kind == "act":
            _check_bit(fault, compute_dtype)  # module outputs are in the compute precision
            self._wrap_module(model, name)
        else:
            self._wrap_gradient(model, name)

    def _wrap_module(self, model: BuiltModel, name: str) -> None:
        for module_name, module in model.named_modules():
            if module_name == name:
                original = module.forward

                def forward(module_self: torch.nn.Module, *args: Any, _original: Callable[..., Any] = original,
                            **kwargs: Any) -> Any:
                    return self._after_forward(_original(*args, **kwargs))

                module.forward = types.MethodType(forward, module)  # type: ignore[method-assign]
                self.present = True
                return

    def _after_forward(self, output: Any) -> Any:
        if self.step != self.fault.step or self._dp_rank != 0 or self._last_hit_step == self.step:
            return output
        self._last_hit_step = self.step
        self.applied += 1
        if isinstance(output, torch.Tensor):
            return _changed(output, self.fault)
        first = _changed(output[0], self.fault)
        return (first, *output[1:])

    def _wrap_gradient(self, model: BuiltModel, name: str) -> None:
        params = dict(model.named_parameters())
        self.present = name in params
        if not self.present:
            return
        param = params[name]
        grad = param.main_grad  # type: ignore[attr-defined]  # Megatron DDP's reduced gradient
        _check_bit(self.fault, grad.dtype)
        if self.fault.kind is FaultKind.BITFLIP and self.fault.index >= grad.numel():
            raise ConfigError(f"fault.index = {self.fault.index} is outside {self.fault.site} "
                              f"({grad.numel()} elements on this rank)")
        config = model.config
        original = config.finalize_model_grads_func

        def finalize(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if self.step == self.fault.step:
                with torch.no_grad():
                    grad.copy_(_changed(grad, self.fault))
                self.applied += 1
            return result

        config.finalize_model_grads_func = finalize


def inject_layout_bug(bug: str, gpt: torch.nn.Module) -> None:
    """Put the layout bug ``bug`` (``config.LAYOUT_BUGS``) into ``gpt`` (a ``GPTModel`` of one pipeline stage with
    two layers or more), from step 0 on; every rank calls it."""
    from megatron.core import parallel_state as ps

    tp_rank = ps.get_tensor_model_parallel_rank()
    modules = dict(gpt.named_modules())
    if bug == "tp_partial_scale" and tp_rank == 1:  # the partial sum before the row-parallel all-reduce
        modules["decoder.layers.1.self_attention.linear_proj"].register_forward_pre_hook(
            lambda module, inputs: (inputs[0] * (1 + 2.0 ** -10), *inputs[1:]))
    elif bug == "sp_norm_unreduced":  # finalize_model_grads sums only parameters marked sequence_parallel
        modules["decoder.layers.1.pre_mlp_layernorm"].weight.sequence_parallel = False
    elif bug == "replica_not_updated" and tp_rank == 1:
        modules["decoder.final_layernorm"].weight.register_hook(lambda grad: torch.zeros_like(grad))
    elif bug == "tp_grad_averaged" and tp_rank == 1:
        modules["decoder.layers.0.mlp.linear_fc2"].weight.register_hook(lambda grad: grad / 2)


def attach(fault: FaultConfig, model: BuiltModel, *, dp_rank: int,
           compute_dtype: torch.dtype) -> FaultInjector | None:
    """A ``FaultInjector`` for ``fault`` (None without one, or for a layout bug: ``inject_layout_bug``, in place);
    fails if no rank holds the site."""
    if fault.kind is FaultKind.NONE:
        return None
    if fault.kind is FaultKind.LAYOUT_BUG:  # the config checked TP >= 2 and one pipeline stage
        inject_layout_bug(fault.bug, model.gpts[0])
        return None
    injector = FaultInjector(fault, model, dp_rank=dp_rank, compute_dtype=compute_dtype)
    device = next(model.gpts[0].parameters()).device
    holders = torch.tensor([1 if injector.present else 0], device=device)
    if dist.is_initialized():
        dist.all_reduce(holders)
    if int(holders[0]) == 0:
        raise ConfigError(f"fault.site = {fault.site!r} names no module or parameter of this model "
                          "(module outputs such as act:layers.0.mlp, parameters such as "
                          "grad:layers.0.mlp.linear_fc1.weight)")
    return injector

"""Rounding probes: a run of the reference whose module outputs and their gradients carry one rounding's noise.

A correct change of layout or precision changes the order of reductions, and so every result by about one
rounding of the precision it computes in. A run whose every module output is multiplied by ``1 + u * r``
(``r`` uniform in [-1, 1], drawn anew per element and call; ``u`` the unit roundoff of the precision) in the
forward pass, and whose gradient into that output gets the same in the backward pass, differs from its
reference by what rounding does, from step 0, at every site. A few such runs make the band a layout or a
precision change is judged against (``workbench.analysis.rounding``).

    with record(run_dir, [model], optimizer, steps=..., perturb="fp32") as run:   # a band run of this loop

The noise comes from a generator of its own (seeded from ``os.urandom``, the same seed on every rank, so
that a tensor replicated over tensor-parallel ranks gets the same noise on each): the training's own random
streams (dropout, data) are untouched.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from workbench.analysis.rounding import UNIT_ROUNDOFF
from workbench.errors import ArgumentError
from workbench.recorder.targets import activation_modules, unwrap

_LINEAR_PARTS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "core_attention")
"""Submodules of a layer perturbed besides the recorded modules: where tensor parallelism splits a reduction."""


class _Noise(torch.autograd.Function):
    """Identity with one rounding's noise, forward on the value and backward on its gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, probe: RoundingProbe) -> torch.Tensor:  # type: ignore[override]
        ctx.probe = probe
        return probe.noisy(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None]:  # type: ignore[override]
        return (None if grad is None else ctx.probe.noisy(grad)), None


class RoundingProbe:
    """The hooks of one band run (``record(..., perturb=PRECISION)``); ``remove()`` takes them off again."""

    def __init__(self, chunks: Sequence[torch.nn.Module], precision: str) -> None:
        if precision not in UNIT_ROUNDOFF:
            raise ArgumentError(f"perturb={precision!r}: the precision whose rounding to add, one of "
                                f"{', '.join(UNIT_ROUNDOFF)}")
        self.precision = precision
        self.size = UNIT_ROUNDOFF[precision]
        seed = torch.tensor([int.from_bytes(os.urandom(7), "little")], dtype=torch.int64)
        if dist.is_initialized():  # one seed everywhere: replicated tensors stay replicated
            device = next(unwrap(chunks[0]).parameters()).device
            seed = seed.to(device)
            dist.broadcast(seed, src=0)
        self.seed = int(seed.item())
        self._generators: dict[torch.device, torch.Generator] = {}
        self.modules = self._modules(list(chunks))
        self._handles = [module.register_forward_hook(self._hook) for _, module in self.modules]

    @staticmethod
    def _modules(chunks: list[torch.nn.Module]) -> list[tuple[str, torch.nn.Module]]:
        found = dict(activation_modules(chunks))
        for name, module in list(found.items()):
            for part, sub in module.named_modules():
                if part and part.split(".")[-1] in _LINEAR_PARTS:
                    found.setdefault(f"{name}.{part}", sub)
        return sorted(found.items())

    def noisy(self, x: torch.Tensor) -> torch.Tensor:
        """``x * (1 + u * r)``, computed in float32 (float64 for float64) and rounded to ``x``'s type."""
        if not x.is_floating_point() or x.numel() == 0:
            return x
        generator = self._generators.get(x.device)
        if generator is None:
            generator = torch.Generator(device=x.device).manual_seed(self.seed)
            self._generators[x.device] = generator
        wide = torch.float64 if x.dtype == torch.float64 else torch.float32
        r = torch.rand(x.shape, generator=generator, device=x.device, dtype=wide).mul_(2.0).sub_(1.0)
        return (x.to(wide) * (1.0 + self.size * r)).to(x.dtype)

    def _hook(self, module: torch.nn.Module, args: Any, output: Any) -> Any:
        if isinstance(output, torch.Tensor):
            return _Noise.apply(output, self)
        if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
            return (_Noise.apply(output[0], self), *output[1:])
        return output

    def describe(self) -> dict[str, Any]:
        """What the manifest says of the probe (``perturbation``)."""
        return {"method": "module outputs and their gradients multiplied by 1 + u*r, r uniform in [-1, 1]",
                "precision": self.precision, "relative_size": self.size, "seed": self.seed,
                "modules": len(self.modules), "where": [name for name, _ in self.modules]}

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


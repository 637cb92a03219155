"""Where the recorder attaches to a training loop, and how it lets go.

For the whole recording it wraps two functions:

* the model config's ``finalize_model_grads_func`` (every Megatron schedule calls it after the
  backward passes: the gradients before the data-parallel reduction, and after it when there
  is no optimizer to read them from);
* the optimizer's ``step``, whose beginning is where the reduced gradients are read: after
  every reduction the loop makes, before any change the optimizer makes.

For recorded steps only it adds module hooks: a forward pre-hook on each model chunk (where a
micro-batch begins), a forward hook on each activation module and on the model output (the
per-token loss), and the hooks of the MoE layers. On a step that is not recorded none of them
is attached, so the forward and backward passes run as if no recorder were there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from workbench.recorder.targets import activation_modules, is_feature_sharded, unwrap

Undo = Callable[[], None]


def wrap_finalize(chunks: Sequence[torch.nn.Module], before: Callable[[], None],
                  after: Callable[[], None] | None) -> list[Undo]:
    """Wrap each chunk config's ``finalize_model_grads_func`` (once per config) so that ``before`` runs
    before it and ``after`` (if given) after it; return what undoes the wraps."""
    undo: list[Undo] = []
    for chunk in chunks:
        config = getattr(chunk, "config", None)
        original = getattr(config, "finalize_model_grads_func", None)
        if config is None or original is None or getattr(original, "_workbench_recorder", False):
            continue

        def finalize(*args: Any, original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            before()
            result = original(*args, **kwargs)
            if after is not None:
                after()
            return result

        finalize._workbench_recorder = True  # type: ignore[attr-defined]
        undo.append(functools.partial(setattr, config, "finalize_model_grads_func", original))
        config.finalize_model_grads_func = finalize
    return undo


def hook_optimizer_step(optimizer: Any, callback: Callable[[], None]) -> Undo | None:
    """Call ``callback`` when ``optimizer.step`` begins; None if it has no ``step``.

    A torch optimizer gets a step pre-hook; any other (Megatron's, the runner's) has its bound
    ``step`` wrapped on the instance.
    """
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer.register_step_pre_hook(lambda *_: callback()).remove
    step = getattr(optimizer, "step", None)
    if not callable(step):
        return None
    own = "step" in vars(optimizer)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        callback()
        return step(*args, **kwargs)

    optimizer.step = wrapped
    return lambda: setattr(optimizer, "step", step) if own else delattr(optimizer, "step")


class StepHooks:
    """The module hooks of a recorded step: ``attach`` before its forward passes, ``remove`` after.

    ``on_microbatch_start(module, args)``, ``on_activation(name, output, sharded)`` and
    ``on_model_output(module, args, output)`` are the recorder's; ``extra()`` attaches further hooks
    (the MoE layers') and returns what removes them.
    """

    def __init__(self, chunks: Sequence[torch.nn.Module], *, activations: bool, loss: bool,
                 on_microbatch_start: Callable[..., None], on_activation: Callable[[str, Any, bool], None],
                 on_model_output: Callable[..., None], extra: Callable[[], Undo] | None = None) -> None:
        self._models = [unwrap(chunk) for chunk in chunks]
        self._modules = [(name, module, is_feature_sharded(module))
                         for name, module in activation_modules(list(chunks))] if activations else []
        self._loss = loss
        self._on_microbatch_start, self._on_activation = on_microbatch_start, on_activation
        self._on_model_output, self._extra = on_model_output, extra
        self._undo: list[Undo] = []

    @property
    def attached(self) -> bool:
        return bool(self._undo)

    def attach(self) -> None:
        if self.attached:
            return
        undo = self._undo
        for model in self._models:
            undo.append(model.register_forward_pre_hook(self._on_microbatch_start).remove)
            if self._loss:
                undo.append(model.register_forward_hook(self._on_model_output).remove)
        for name, module, sharded in self._modules:
            undo.append(module.register_forward_hook(
                lambda m, args, out, name=name, sharded=sharded: self._on_activation(name, out, sharded)).remove)
        if self._extra is not None:
            undo.append(self._extra())

    def remove(self) -> None:
        for undo in self._undo:
            undo()
        self._undo = []

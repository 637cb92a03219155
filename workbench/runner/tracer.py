"""Operation trace of one training step: every ATen/c10d operation with fingerprints of its tensors.

    with OpTracer(model_chunks, rank=rank, tp_rank=tp_rank) as tracer:
        trainer.train_step(step)
    tracer.write(paths.op_trace(step, rank))

A ``TorchDispatchMode`` sees each operation below autograd: forward, backward (the autograd
engine's own kernels and custom ``backward`` functions), communication (``c10d`` ops) and
the optimizer. For each one it writes a ``TracedOperation`` (``workbench.store.op_trace``, which
owns the file's schema): seq, phase (forward | backward | step), micro-batch, scope (canonical
module name), op, occurrence, source (file:line of the Python code that issued it), and its
input and output tensors' shape, dtype, fingerprint, non-finite count and whether they are
defined.

Operations are aligned across two runs by (phase, scope, op, occurrence). The module scope
of a forward operation comes from a stack kept by global module hooks, its micro-batch from
counting the model's forward calls; a backward operation takes the scope and micro-batch of
the forward module that created its autograd node (each module's forward hook tags the
nodes it created), and its source line from the node's creation
traceback (anomaly mode, with NaN checks off). Fingerprints are 64-bit BLAKE2b digests
of the tensor's bytes, taken before an operation for its inputs (in-place operations
change them) and after it for its outputs. Operations issued by the recorder are left out.

Costly by design (every tensor of every operation is hashed on the host) and meant for
one step of a replay.
"""

from __future__ import annotations

import hashlib
import os
import sys
import warnings
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from workbench.recorder.targets import first_expert, global_layers, unwrap
from workbench.sites import canonical_name
from workbench.store.op_trace import TracedOperation, TracedTensor, write_trace

SCOPE_KEY = "workbench_scope"
_TORCH_DIR = os.path.dirname(torch.__file__)
_THIS_FILE = os.path.abspath(__file__)
_RECORDER_DIR = os.path.join(os.path.dirname(os.path.dirname(_THIS_FILE)), "recorder")
_IN_THE_TRAINING = tuple(os.path.join(_RECORDER_DIR, name) for name in ("nondeterminism.py", "rounding.py"))
"""Files of the recorder's folder whose operations are the training's own: the emulated nondeterminism and a band
run's rounding noise (traced as what the step computed, not left out as the recorder's reads)."""
_PASS_THROUGH = (_THIS_FILE, os.path.join(os.path.dirname(_THIS_FILE), "cpu_compat.py"))
"""Frames that only forward a call (this tracer, the CPU device-rewriting function mode)."""
_UNDEFINED_OUTPUT = {"aten::empty", "aten::empty_like", "aten::new_empty", "aten::empty_strided",
                     "aten::new_empty_strided"}
"""Operations whose outputs are uninitialised memory: their fingerprints say nothing."""
_UNDEFINED_SOURCE = ("megatron/core/utils.py", " in get_tensor")
"""Megatron's ``GlobalMemoryBuffer.get_tensor`` hands out views of a buffer it never clears."""


def fingerprint(t: torch.Tensor) -> str:
    """64-bit digest of the tensor's bytes in logical (row-major) order, as 16 hex digits."""
    data = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy()
    return hashlib.blake2b(data.tobytes(), digest_size=8).hexdigest()


def _describe(t: torch.Tensor, defined: bool = True) -> TracedTensor:
    """An undefined tensor (uninitialised memory) is still fingerprinted, so that analysis can recognise
    its bytes where a later operation reads them."""
    nonfinite = int((~torch.isfinite(t)).sum()) if t.is_floating_point() and t.numel() else 0
    return TracedTensor(tuple(t.shape), str(t.dtype).removeprefix("torch."), fingerprint(t), nonfinite, defined)


def _short(path: str) -> str:
    for marker in ("site-packages" + os.sep, "workbench" + os.sep):
        if marker in path:
            head, _, tail = path.rpartition(marker)
            return tail if marker.startswith("site") else "workbench/" + tail
    return path


def _is_library(path: str) -> bool:
    return path.startswith(_TORCH_DIR) or path in _PASS_THROUGH or path.endswith(("contextlib.py", "functools.py"))


def _caller(frame: FrameType | None) -> tuple[str | None, bool]:
    """(the first frame outside torch, as 'file:line in function'; whether that frame is the recorder's).

    None for kernels the autograd engine runs on its own: the walk reaches the
    ``backward()`` call before any frame outside torch.
    """
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(_TORCH_DIR) and frame.f_code.co_name in ("backward", "_engine_run_backward"):
            return None, False
        if not _is_library(path):
            return (f"{_short(path)}:{frame.f_lineno} in {frame.f_code.co_name}",
                    path.startswith(_RECORDER_DIR) and not path.startswith(_IN_THE_TRAINING))
        frame = frame.f_back
    return None, False


def _metadata(node: Any) -> dict[str, Any]:
    """An autograd node's metadata dict (a property at run time; typed as a method in torch's stubs)."""
    return node.metadata  # type: ignore[no-any-return]


def _creation_site(node: Any) -> str | None:
    """Where the forward operation that created an autograd node was called (anomaly-mode traceback)."""
    trace = _metadata(node).get("traceback_") if node is not None else None
    for entry in reversed(trace or []):
        first = entry.strip().splitlines()[0]  # '  File "/path", line 12, in forward'
        try:
            path = first.split('"')[1]
            line = first.split("line ")[1].split(",")[0]
            function = first.rsplit(" in ", 1)[1]
        except IndexError:
            continue
        if not _is_library(path):
            return f"{_short(path)}:{line} in {function}"
    return None


def _written(func: Any, args: Any, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensor arguments an operation writes in place (from its schema's alias annotations)."""
    found = []
    for i, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(argument.name)
        found += [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
    return found


class OpTracer(TorchDispatchMode):
    """Traces every operation run while it is active (see the module docstring)."""

    def __init__(self, chunks: list[torch.nn.Module], *, rank: int, tp_rank: int) -> None:
        super().__init__()
        self.rank, self.tp_rank = rank, tp_rank
        self.rows: list[TracedOperation] = []
        self._names: dict[int, str] = {}
        for chunk in chunks:
            model = unwrap(chunk)
            layers, first = global_layers(model), first_expert(model)
            for local_name, module in model.named_modules():
                self._names[id(module)] = canonical_name(local_name, layers, first) if local_name else "model"
        self._scopes: list[str] = []
        self._microbatch = -1
        self._occurrence: Counter[tuple[str, str, str]] = Counter()  # (phase, scope, op)
        self._hooks: list[Any] = []
        self._anomaly: Any = None

    # -- module scope ---------------------------------------------------------------------

    def _enter_module(self, module: torch.nn.Module, args: Any) -> None:
        name = self._names.get(id(module))
        if name is not None:
            if not self._scopes:
                self._microbatch += 1  # the model's own forward: a new micro-batch
            self._scopes.append(name)

    def _leave_module(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        name = self._names.get(id(module))
        if name is None:
            return
        self._tag_nodes(output, (name, self._microbatch))
        if self._scopes and self._scopes[-1] == name:
            self._scopes.pop()

    @staticmethod
    def _tag_nodes(output: Any, scope: tuple[str, int]) -> None:
        """Tag the autograd nodes this module created (those not tagged by an inner module)."""
        pending: list[Any] = [t.grad_fn for t in tree_leaves(output) if isinstance(t, torch.Tensor)]
        while pending:
            node = pending.pop()
            if node is None or SCOPE_KEY in _metadata(node):
                continue
            _metadata(node)[SCOPE_KEY] = scope
            pending.extend(next_node for next_node, _ in node.next_functions)

    # -- context ---------------------------------------------------------------------------

    def __enter__(self) -> OpTracer:
        from torch.nn.modules import module as nn_module

        self._hooks = [nn_module.register_module_forward_pre_hook(self._enter_module),
                       nn_module.register_module_forward_hook(self._leave_module, always_call=True)]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Anomaly Detection has been enabled": on purpose
                self._anomaly = torch.autograd.detect_anomaly(check_nan=False)
                self._anomaly.__enter__()
            return super().__enter__()  # type: ignore[no-any-return]
        except BaseException:
            self._restore()
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._restore(*exc)

    def _restore(self, *exc: Any) -> None:
        """Leave anomaly mode and remove the global module hooks, whatever happened."""
        if self._anomaly is not None:
            self._anomaly.__exit__(*(exc or (None, None, None)))
            self._anomaly = None
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # -- operations ------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        source, from_recorder = _caller(sys._getframe(1))
        if from_recorder:
            return func(*args, **kwargs)
        node = torch._C._current_autograd_node()
        if node is not None:
            phase, (scope, microbatch) = "backward", _metadata(node).get(SCOPE_KEY, ("", -1))
            source = source or _creation_site(node)
        elif self._scopes:
            phase, scope, microbatch = "forward", self._scopes[-1], self._microbatch
        else:
            phase, scope, microbatch = "step", "", -1
        name = func._schema.name
        inputs = [_describe(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        out = func(*args, **kwargs)
        if name.startswith("c10d::"):
            for leaf in tree_leaves(out):  # an asynchronous collective: its result exists after wait()
                if hasattr(leaf, "wait"):
                    leaf.wait()
        defined = name not in _UNDEFINED_OUTPUT and not (
            source is not None and source.startswith(_UNDEFINED_SOURCE[0]) and source.endswith(_UNDEFINED_SOURCE[1]))
        outputs = [_describe(t, defined) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        # An in-place write into a view changes its base, which no later operation may output:
        # the base's new value is an output too (so the write is found as what made it).
        outputs += [_describe(t._base) for t in _written(func, args, kwargs) if t._base is not None]
        op = str(func.overloadpacket.__name__) if name.startswith("aten::") else name.replace("::", ".")
        key = (phase, scope, op)
        self.rows.append(TracedOperation(seq=len(self.rows), rank=self.rank, tp_rank=self.tp_rank, phase=phase,
                                         microbatch=microbatch, scope=scope, op=op, occurrence=self._occurrence[key],
                                         node=node.name() if node is not None else None, source=source,
                                         inputs=inputs, outputs=outputs))
        self._occurrence[key] += 1
        return out

    def write(self, path: Path) -> Path:
        return write_trace(path, self.rows)

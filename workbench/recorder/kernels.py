"""Statistics and fingerprint of one tensor (or shard) in one pass on its own device.

``partial_stats`` returns the additive part, the maximum part and the fingerprint of a
tensor piece whose elements sit at known positions of a full tensor; partial results of
disjoint pieces merge by addition and maximum (see ``workbench.statistics``, which also
holds the numpy reference these kernels are tested against).

Four paths compute the same thing: ``eager`` (plain torch calls, many passes, any
device), ``compiled`` (``torch.compile``: one fused graph), ``native`` (a small C++ kernel
for CPU tensors, built once per machine with the system compiler: one pass, all
accumulators in registers, and a call costs microseconds where a compiled graph's guards
cost ~100) and ``triton`` (``workbench.recorder.triton_pass``, for CUDA tensors: one read,
one launch, the accumulators added on the device, a start-of-step copy or an update's
difference taken in the same read). ``accumulate`` picks the fastest path that fits the
tensor, and ``PATHS`` counts the calls each path took (the run's manifest keeps them).
The fingerprint is integer arithmetic and therefore bitwise the same on every path and
device (but for the payload of a NaN that a difference or a division produces, which is the
device's: a GPU gives the canonical NaN); the float sums agree to rounding.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from workbench import disk
from workbench.statistics import FP_LANES, to_signed32

_LANES = [(to_signed32(index_mult), to_signed32(mix_mult), before, (1 << (32 - before)) - 1, after,
           (1 << (32 - after)) - 1) for index_mult, mix_mult, before, after in FP_LANES]

PartialFn = Callable[[torch.Tensor, torch.Tensor, float, float], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def element_words(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The int32 words lanes A and B read from each element of ``x`` (same shape as ``x``)."""
    if x.element_size() == 1:  # float8 (e4m3, e5m2): its bits, zero-extended
        bits = x.view(torch.uint8).to(torch.int32)
        return bits, bits
    if x.element_size() == 2:
        bits = x.view(torch.int16).to(torch.int32) & 0xFFFF
        return bits, bits
    if x.element_size() == 4:
        bits = x.view(torch.int32)
        return bits, bits
    words = x.view(torch.int32).view(*x.shape, 2)
    return words[..., 0], words[..., 1]


def full_index(x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """Row-major index in the full tensor, modulo 2^32 (int32), of every element of ``x``.

    ``coords`` is int32 [x.ndim, 2]: per local dimension, its offset and its stride in the
    full tensor (so a shard, a permuted view or a slice of samples all map to the full
    tensor). int32 arithmetic wraps, which is exactly the mod 2^32 the lanes use.
    """
    index = torch.zeros((), dtype=torch.int32, device=x.device)
    for dim in range(x.ndim):
        shape = [1] * x.ndim
        shape[dim] = x.shape[dim]
        positions = torch.arange(x.shape[dim], dtype=torch.int32, device=x.device) + coords[dim, 0]
        index = index + (positions * coords[dim, 1]).view(shape)
    return index


def _partial(x: torch.Tensor, coords: torch.Tensor, tiny: float, largest: float):  # type: ignore[no-untyped-def]
    index = full_index(x, coords)
    lanes = []
    for bits, (index_mult, mix_mult, before, before_mask, after, after_mask) in zip(element_words(x), _LANES):
        v = bits ^ (index * index_mult)
        # Logical shifts right of an int32: arithmetic shift, then drop the sign copies.
        v = (v ^ ((v >> before) & before_mask)) * mix_mult
        lanes.append((v ^ ((v >> after) & after_mask)).sum(dtype=torch.int64))
    xf = x.to(torch.float32) if x.element_size() < 4 else x
    finite = torch.isfinite(xf)
    f = torch.where(finite, xf, 0.0)
    magnitude = f.abs()
    f64 = f.to(torch.float64)
    sums = torch.stack([
        torch.ones_like(f64).sum(), f64.sum(), (f64 * f64).sum(), torch.isnan(xf).sum().to(torch.float64),
        torch.isinf(xf).sum().to(torch.float64), (xf == 0).sum().to(torch.float64),
        ((magnitude > 0) & (magnitude < tiny)).sum().to(torch.float64),
        (magnitude > largest).sum().to(torch.float64),
    ])
    neg_inf = float("-inf")
    maxes = torch.stack([torch.where(finite, xf, neg_inf).amax(), torch.where(finite, -xf, neg_inf).amax(),
                         torch.where(finite, magnitude, neg_inf).amax()]).to(torch.float64)
    return sums, maxes, torch.stack(lanes)


def eager() -> PartialFn:
    return _partial


@functools.cache
def compiled() -> PartialFn:
    """``_partial`` through ``torch.compile`` (one fused pass; Triton on GPU).

    ``tiny`` and ``largest`` are constants of the graph (``specialize_float``), one graph per pair (a run
    has one pair per precision): left to Dynamo's default, a float becomes a 0-d float64 CPU tensor read
    back with ``.item()`` inside the graph, which torch 2.11's inductor fails to lower for a CUDA graph
    (``tensorify_python_scalars``: "Expected a value of type 'Tensor' ... 'MetaProxy'", seen on an H200;
    the CPU lowering takes it). A graph that fails to compile all the same never stops the training
    around it: one warning, then the eager pass (same numbers, many more kernel launches: on the H200,
    1.3 s per recorded step of an 8-layer GPT against 0.2 s for the step itself) from then on.
    """

    @functools.cache
    def graph(tiny: float, largest: float) -> Callable[[torch.Tensor, torch.Tensor], Any]:
        def bound(x: torch.Tensor, coords: torch.Tensor):  # type: ignore[no-untyped-def]
            return _partial(x, coords, tiny, largest)

        return torch.compile(bound, dynamic=True, fullgraph=True)

    failed: list[str] = []

    def call(x: torch.Tensor, coords: torch.Tensor, tiny: float, largest: float):  # type: ignore[no-untyped-def]
        if failed:
            return _partial(x, coords, tiny, largest)
        try:
            # One graph per dtype and rank of tensor (and pattern of size-1 dimensions): a run
            # sees a handful; the default limit of 8 is too tight for a process that records several.
            with torch._dynamo.config.patch(recompile_limit=64, specialize_float=True):
                return graph(tiny, largest)(x, coords)
        except Exception as err:  # a compiler's failure, not the data's: the eager pass raises those again
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            failed.append(f"{type(err).__name__}: {' '.join(lines[:3])[:300]}")
            warnings.warn(f"workbench: torch.compile of the statistics pass failed on {x.device.type} "
                          f"({failed[0]}); recording with the eager pass from now on", RuntimeWarning, stacklevel=2)
            return _partial(x, coords, tiny, largest)

    return call


PATHS: collections.Counter[str] = collections.Counter()
"""Tensors read by each path in this process (``native``, ``triton``, ``compiled``, ``eager``)."""
BUILD_FAILURES: dict[str, str] = {}
"""Per path (and element type) that could not be built here: the compiler's message (the calls went another way)."""
BUILD_SECONDS: dict[str, float] = {}
"""Per Triton kernel (element type) built in this process: the seconds its first launch took, build included."""


@functools.cache
def _triton_pass() -> Any:
    """``workbench.recorder.triton_pass``, or None where Triton is not installed (the CPU wheel of torch)."""
    try:
        from workbench.recorder import triton_pass
    except ImportError:
        return None
    return triton_pass


def _on_device(x: torch.Tensor) -> bool:
    """Whether ``x`` is a tensor the Triton kernels could read (a CUDA one)."""
    return x.is_cuda


def _on_gpu(x: torch.Tensor, coords: torch.Tensor, tiny: float, largest: float, acc: torch.Tensor,
            lanes: torch.Tensor, **how: Any) -> bool:
    """Read ``x`` with the Triton kernel (``how``: its ``copy``, ``before`` or ``divisor``); False where it does not
    take the tensor or cannot be built on this GPU. A kernel that fails to build says so once, loudly, at the first
    recorded step, and the run goes on with the compiled pass (the manifest names both)."""
    if not _on_device(x):  # (Triton is not even imported for a CPU run)
        return False
    module = _triton_pass()
    if module is None or not module.takes(x):
        return False
    name = f"triton {str(x.dtype).removeprefix('torch.')}"
    if name in BUILD_FAILURES:
        return False
    first = name not in BUILD_SECONDS
    started = time.perf_counter()
    try:
        taken = bool(module.accumulate(x, host_rows(coords), tiny, largest, acc, lanes, **how))
    except module.KernelBuildError as err:  # the compiler's failure (the data cannot make this kernel raise)
        _build_failed(name, str(err), f"recording {x.dtype} tensors with the compiled pass, several kernels a tensor")
        return False
    if taken:
        if first:
            BUILD_SECONDS[name] = round(time.perf_counter() - started, 3)
        PATHS["triton"] += 1
    return taken


def _build_failed(name: str, message: str, instead: str) -> None:
    """Say once, loudly, that kernel ``name`` could not be built here, and what reads its tensors ``instead``."""
    BUILD_FAILURES[name] = message
    warnings.warn(f"workbench: the {name} statistics kernel could not be built for this GPU ({message}); {instead} "
                  "(the run's manifest says so)", RuntimeWarning, stacklevel=4)


def _many_on_gpu(entries: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None,
                                      torch.Tensor | None]], tiny: float, largest: float) -> list[bool]:
    """Read each (x, coords, acc, lanes, copy, before) of ``entries`` with the Triton table kernel, a handful of
    launches for all of them; which were read. A kernel that fails to build says so once, as ``_on_gpu`` does."""
    if not any(_on_device(x) for x, *_ in entries):  # (Triton is not even imported for a CPU run)
        return [False] * len(entries)
    module = _triton_pass()
    if module is None:
        return [False] * len(entries)
    wanted = [i for i, (x, *_) in enumerate(entries)
              if module.takes(x) and f"triton table {str(x.dtype).removeprefix('torch.')}" not in BUILD_FAILURES]
    taken = [False] * len(entries)
    if not wanted:
        return taken
    started = time.perf_counter()
    read, failures = module.accumulate_table(
        [(x, host_rows(c), a, lane, copy, before) for x, c, a, lane, copy, before in (entries[i] for i in wanted)],
        tiny, largest)
    for dtype, message in failures.items():
        _build_failed(f"triton table {str(dtype).removeprefix('torch.')}", message,
                      f"recording {dtype} tensors one launch each from now on")
    for dtype in {entries[i][0].dtype for i, ok in zip(wanted, read) if ok}:
        BUILD_SECONDS.setdefault(f"triton table {str(dtype).removeprefix('torch.')}",
                                 round(time.perf_counter() - started, 3))
    for i, ok in zip(wanted, read):
        taken[i] = ok
    PATHS["triton"] += sum(read)
    return taken


def partial_stats(x: torch.Tensor, coords: torch.Tensor, tiny: float, largest: float, *,
                  fn: PartialFn | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sums [8] float64, maxes [3] float64, lane sums [2] int64) of ``x``, on x's device."""
    x = x.detach().contiguous()
    if x.numel() == 0:
        zeros = torch.zeros(8, dtype=torch.float64, device=x.device)
        return zeros, torch.full((3,), float("-inf"), dtype=torch.float64, device=x.device), \
            torch.zeros(2, dtype=torch.int64, device=x.device)
    return (fn or _partial)(x, coords, tiny, largest)


ISAS = ("native", "avx2", "scalar")
"""Builds of the native kernel: for this machine's vector units (what the recorder uses), or held
to AVX2 or to scalar code (the tests compare each path this machine can run with the others)."""
_ISA_FLAGS = {"native": [], "avx2": ["-mno-avx512f"], "scalar": ["-mno-avx2", "-mno-avx512f"]}


@functools.cache
def native(isa: str = "native") -> Any:
    """The C++ kernel module (``accumulate``, ``accumulate_many``, ``accumulate_differences``,
    ``accumulate_copies``, ``instruction_set``), built on first use and cached per machine; ``isa`` holds
    the build to fewer vector instructions (``ISAS``)."""
    cpp_extension = quiet_cpp_extension()
    # a read-only home: the build goes to a temporary folder instead
    disk.writable_caches(say=lambda line: warnings.warn(line, stacklevel=3))

    source = Path(__file__).with_name("native_stats.cpp")
    code = b"".join(p.read_bytes() for p in (source, *sorted(source.parent.glob("native_*.h"))))
    # -march=native: the build is only valid on this kind of CPU, so its name says which.
    flags = Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0] if Path("/proc/cpuinfo").exists() \
        else os.uname().machine
    key = hashlib.sha256(code + flags.encode() + torch.__version__.encode() + isa.encode()).hexdigest()
    name = f"workbench_stats_{key[:12]}"
    built = _built(name)
    if built is not None:
        return built
    # cpp_extension runs `ninja` from PATH; the one pip installed sits beside this Python.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    return cpp_extension.load(name=name, sources=[str(source)],
                              extra_cflags=["-O3", "-march=native", *_ISA_FLAGS[isa], "-fopenmp"],
                              extra_ldflags=["-fopenmp"], verbose=False)


def quiet_cpp_extension() -> Any:
    """``torch.utils.cpp_extension``, imported without its warning on a machine with a CUDA toolkit but no GPU
    ("No CUDA runtime is found, using CUDA_HOME=..."): this kernel is built for the CPU, and the line would reach
    the user's terminal beside a verb's own output."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        logger.setLevel(level)
    return cpp_extension


def _built(name: str) -> Any:
    """The module ``name`` as an earlier process built it, imported without asking ninja (``load`` spends
    1.5-5 s per process on that check, and every rank of every run pays it), or None. The name holds the hash
    of the sources, flags and torch, so a module of that name is current; one whose build holds the lock may
    be half written and is left to ``load``."""
    cpp_extension = quiet_cpp_extension()
    directory = Path(cpp_extension._get_build_directory(name, verbose=False))
    if not (directory / f"{name}.so").is_file() or (directory / "lock").exists():
        return None
    return cpp_extension._import_module_from_library(name, str(directory), True)


def divided(x: torch.Tensor, divisor: int) -> torch.Tensor:
    """``x / divisor`` in x's type, IEEE-rounded on every device, as the Triton kernel divides: torch's CUDA kernel
    multiplies by the reciprocal of a Python number (a last-bit difference for a divisor that is not a power of
    two), so on a GPU the divisor is a 0-d tensor on the device (a fill, no upload, no wait)."""
    if divisor == 1:
        return x
    if x.device.type == "cpu":
        return x / divisor
    return x / torch.full((), float(divisor), dtype=torch.float32, device=x.device)


def new_accumulators(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty accumulators: float64 [11] (8 sums, then max, -min, absmax) and int64 [2] lanes."""
    acc, lanes = _empty_accumulators(device)
    return acc.clone(), lanes.clone()  # a clone costs a few microseconds, building them ~40


@functools.cache
def _empty_accumulators(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    acc = torch.zeros(11, dtype=torch.float64, device=device)
    acc[8:] = float("-inf")
    return acc, torch.zeros(2, dtype=torch.int64, device=device)


def takes_native(x: torch.Tensor) -> bool:
    """Whether the native kernel reads ``x``: a CPU tensor of 2, 4 or 8 bytes an element (a float8 tensor goes the
    eager way: the native pass has no 1-byte path)."""
    return x.device.type == "cpu" and x.element_size() > 1


def accumulate(x: torch.Tensor, coords: torch.Tensor, tiny: float, largest: float, acc: torch.Tensor,
               lanes: torch.Tensor, *, fused: bool = True, divisor: int = 1) -> None:
    """Add the statistics and fingerprint lanes of ``x`` (of ``x / divisor``) into ``acc`` and ``lanes`` (in place).

    ``fused``: the native kernel for CPU tensors, the Triton one for CUDA tensors (which divides in registers),
    the compiled one elsewhere; otherwise eager.
    """
    if divisor != 1:
        if fused and _on_gpu(x, coords, tiny, largest, acc, lanes, divisor=divisor):
            return
        x = divided(x, divisor)
    if fused and takes_native(x):
        x = x.detach().contiguous()
        if x.numel():
            native().accumulate(x, coords, tiny, largest, acc, lanes)
        PATHS["native"] += 1
        return
    if fused and _on_gpu(x, coords, tiny, largest, acc, lanes):
        return
    PATHS["compiled" if fused else "eager"] += 1
    sums, maxes, part = partial_stats(x, coords, tiny, largest, fn=compiled() if fused else eager())
    acc[:8] += sums
    torch.maximum(acc[8:], maxes, out=acc[8:])
    lanes += part


def accumulate_many(items: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]], tiny: float,
                    largest: float, *, fused: bool = True) -> None:
    """``accumulate`` for each (x, coords, acc, lanes) of ``items``; CPU tensors in one native call
    (one parallel pass over all their chunks), CUDA tensors in the Triton table kernel (a launch per element
    type), the others one by one."""
    on_cpu = [(x.detach().contiguous(), c, a, lane) for x, c, a, lane in items if fused and takes_native(x)]
    if on_cpu:
        xs, coords, accs, lanes = (list(column) for column in zip(*on_cpu))
        native().accumulate_many(xs, coords, tiny, largest, accs, lanes)
        PATHS["native"] += len(xs)
    others = [(x, c, a, lane) for x, c, a, lane in items if not (fused and takes_native(x))]
    on_gpu = _many_on_gpu([(x, c, a, lane, None, None) for x, c, a, lane in others], tiny, largest) if fused \
        else [False] * len(others)
    for (x, c, a, lane), done in zip(others, on_gpu):
        if not done:
            accumulate(x, c, tiny, largest, a, lane, fused=fused)


def accumulate_differences(items: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
                           tiny: float, largest: float, *, fused: bool = True) -> None:
    """``accumulate`` of ``float32(x) - float32(before)`` for each (x, before, coords, acc, lanes) of
    ``items`` (an optimizer step's update). On the CPU one native call reads both tensors and never
    materialises the difference; on a GPU the Triton kernel takes it in registers likewise; elsewhere (and for
    float64) the difference is taken in torch. All give the float32 tensor the subtraction gives, so the same
    fingerprint."""
    native_items, others = [], []
    on_gpu = _many_on_gpu([(x, c, a, lane, None, before) for x, before, c, a, lane in items], tiny, largest) \
        if fused else [False] * len(items)
    for (x, before, c, a, lane), done in zip(items, on_gpu):
        if done:
            continue
        if fused and takes_native(x) and x.dtype != torch.float64 and x.dtype == before.dtype:
            native_items.append((x.detach().contiguous(), before.contiguous(), c, a, lane))
        else:
            others.append((x.detach().float() - before.float(), c, a, lane))
    if native_items:
        xs, befores, coords, accs, lanes = (list(column) for column in zip(*native_items))
        native().accumulate_differences(xs, befores, coords, tiny, largest, accs, lanes)
        PATHS["native"] += len(xs)
    if others:
        accumulate_many(others, tiny, largest, fused=fused)


def accumulate_copies(items: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
                      tiny: float, largest: float, *, fused: bool = True) -> None:
    """``accumulate`` for each (x, copy, coords, acc, lanes) of ``items``, also copying x into ``copy``: on the
    CPU in the same native pass (one read of x), on a GPU in the Triton kernel's, elsewhere (and for float64)
    with ``copy_``."""
    native_items = []
    on_gpu = _many_on_gpu([(x, c, a, lane, copy, None) for x, copy, c, a, lane in items], tiny, largest) \
        if fused else [False] * len(items)
    for (x, copy, c, a, lane), done in zip(items, on_gpu):
        if done:
            continue
        if fused and takes_native(x) and x.dtype != torch.float64 and x.is_contiguous() \
                and copy.is_contiguous():
            native_items.append((x.detach(), copy, c, a, lane))
        else:
            copy.copy_(x.detach())
            accumulate(x, c, tiny, largest, a, lane, fused=fused)
    if native_items:
        xs, copies, coords, accs, lanes = (list(column) for column in zip(*native_items))
        native().accumulate_copies(xs, copies, coords, tiny, largest, accs, lanes)
        PATHS["native"] += len(xs)


def identity_coords(shape: tuple[int, ...] | torch.Size, device: torch.device | None = None) -> torch.Tensor:
    """coords of a whole, unsharded tensor of ``shape`` (offsets 0, row-major strides)."""
    strides = []
    stride = 1
    for size in reversed(shape):
        strides.append(stride)
        stride *= size
    strides.reverse()
    return coords_tensor([[0, s] for s in strides], device)


def coords_tensor(rows: list[list[int]], device: torch.device | None = None) -> torch.Tensor:
    """int32 [ndim, 2] (offset, stride) rows, each value taken modulo 2^32 (kept on the host too, for the
    Triton kernel's scalar arguments)."""
    coords = torch.tensor([[to_signed32(v) for v in row] for row in rows], dtype=torch.int32).view(len(rows), 2)
    if device is not None and torch.device(device).type == "cuda":  # from pinned memory: the stream never waits
        coords = coords.pin_memory().to(device, non_blocking=True)
    elif device is not None:
        coords = coords.to(device)
    setattr(coords, _ROWS, tuple((to_signed32(offset), to_signed32(stride)) for offset, stride in rows))
    return coords


def host_rows(coords: torch.Tensor) -> tuple[tuple[int, int], ...] | None:
    """The (offset, stride) rows ``coords_tensor`` made ``coords`` from, or None for a tensor it did not make."""
    rows: tuple[tuple[int, int], ...] | None = getattr(coords, _ROWS, None)
    return rows


_ROWS = "_workbench_host_rows"

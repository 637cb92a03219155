"""The statistics and fingerprint of GPU tensors in Triton kernels: one read of each tensor, few launches.

``accumulate`` adds the ``workbench.statistics`` vector and fingerprint lanes of a tensor (or shard, or a slice
of an activation) into a site's accumulators on the device, as ``kernels.accumulate`` does, in one launch with
scalar arguments; ``accumulate_table`` does the same for many tensors (the parameter side) in one launch per
element type and mode, over a table of pointers. In the same read a kernel can copy the tensor into a buffer (the
optimizer's start-of-step copy), read the difference of two tensors (``update = after - before``) or a tensor
divided by the data-parallel size, never materialised. Nothing is allocated and nothing is read back per
launch, so the training stream never waits.

What a kernel computes, per program (a persistent grid, each program looping over tiles):

* the fingerprint lanes: integer words summed modulo 2^32 (any order gives the same bits);
* counts and extremes: exact (integers, and maxima of the values themselves);
* sums in float32 per element lane, merged in float64 at the end. A tile holding any NaN, Inf or value past
  2^32 (or past the run precision's largest) is summed in float64 instead, so huge values neither overflow a
  float32 partial nor lose the small ones beside them;
* its partials are written to a workspace; the last program to finish a tensor (an atomic counter) folds them
  in order and adds them into the accumulators. No float atomics: two runs give the same bits.

One kernel of each kind per element type (``KINDS``; the table kernel for ``TABLE_TYPES``); the mode (plain,
copy, difference, divided) and the number of dimensions after merging those that are contiguous in the full
tensor (1, 2 or 3; a 4-D placement that does not merge goes the compiled way) are arguments, branches taken once
per tile, not specialisations (``build`` compiles every kernel for sm_80 and sm_90 in about 6 s each). Under
``TRITON_INTERPRET=1`` the same kernels run on CPU tensors (the tests).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
import triton
import triton.language as tl

from workbench.statistics import to_signed32

KINDS: dict[torch.dtype, int] = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float64: 3,
                                 torch.float8_e4m3fn: 4, torch.float8_e5m2: 5}
"""The element types the kernel reads, each its own specialisation."""
_WORDS = {0: torch.int32, 1: torch.int16, 2: torch.int16, 3: torch.int32, 4: torch.uint8, 5: torch.uint8}
PLAIN, COPY, DIFFERENCE, DIVIDED = 0, 1, 2, 3
MODES = (PLAIN, COPY, DIFFERENCE, DIVIDED)
BLOCK = 1024
MAX_PROGRAMS = 1024
PROGRAMS = 512
"""Programs a launch runs on any GPU (about four per SM on an H100's 132): a fixed partition of the work."""
_COLUMNS = 16  # per program: 8 sums, 3 maxima, 2 lanes (and room)
_LARGEST_INDEX = 2**31 - 2 * BLOCK  # word offsets are int32 in the kernels


@triton.jit
def _mix(word, index, INDEX_MULT: tl.constexpr, MIX_MULT: tl.constexpr, BEFORE: tl.constexpr,
         AFTER: tl.constexpr):
    """One fingerprint lane's word (``workbench.statistics``): uint32 arithmetic, wrapping."""
    v = word ^ (index * INDEX_MULT)
    v = (v ^ (v >> BEFORE)) * MIX_MULT
    return v ^ (v >> AFTER)


@triton.jit
def _bits(raw, KIND: tl.constexpr):
    """The element's bits, zero-extended to uint32, from its loaded word (int32, int16 or uint8)."""
    if KIND == 0:
        return raw.to(tl.uint32, bitcast=True)
    elif KIND == 1 or KIND == 2:
        return (raw.to(tl.int32) & 0xFFFF).to(tl.uint32, bitcast=True)
    else:
        return raw.to(tl.uint32)


@triton.jit
def _value(raw, KIND: tl.constexpr):
    """The element's value as float32, decoded with integer arithmetic where a bitcast is not exact everywhere
    (the interpreter's bfloat16 bitcast gets subnormals wrong; float8 has no conversion on sm_80)."""
    if KIND == 0:
        return raw.to(tl.float32, bitcast=True)
    elif KIND == 1:
        return ((raw.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
    elif KIND == 2:
        return raw.to(tl.float16, bitcast=True).to(tl.float32)
    elif KIND == 5:  # e5m2: the top byte of a float16
        return (raw.to(tl.int32) << 8).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:  # e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, no infinities, NaN at S.1111.111
        b = raw.to(tl.int32)
        exponent = (b >> 3) & 15
        mantissa = b & 7
        sign = (b >> 7) << 31
        normal = (sign | ((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
        subnormal = mantissa.to(tl.float32) * 0.001953125  # m * 2^-9, exact
        subnormal = tl.where(sign != 0, -subnormal, subnormal)
        value = tl.where(exponent == 0, subnormal, normal)
        return tl.where((exponent == 15) & (mantissa == 7), float("nan"), value)


@triton.jit
def _rounded_bits(value, KIND: tl.constexpr):
    """The bits (uint32) of float32 ``value`` rounded to nearest even in the element type (float32, bfloat16,
    float16), as torch rounds on the CPU (bfloat16: c10's integer rounding, NaN as 0x7FC0)."""
    if KIND == 0:
        return value.to(tl.uint32, bitcast=True)
    elif KIND == 1:
        bits = value.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return tl.where(value != value, 0x7FC0, rounded).to(tl.uint32)
    else:
        return (value.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF).to(tl.uint32)


@triton.jit
def _from_bits(word, KIND: tl.constexpr):
    """The float32 value of the element type's bits ``word`` (uint32, zero-extended)."""
    if KIND == 0:
        return word.to(tl.float32, bitcast=True)
    elif KIND == 1:
        return (word << 16).to(tl.float32, bitcast=True)
    else:
        return word.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _tiles(x_ptr, other_ptr, copy_ptr, n, first, last, step, mode, dims, base, size1, size2, stride0, stride1,
           stride2, divisor, tiny, largest, fast_limit, row_ptr, KIND: tl.constexpr, BLOCK: tl.constexpr):
    """Read tiles ``first, first + step, ... < last`` of one tensor and store their partials (8 sums, 3 maxima,
    2 lane sums, float64) at ``row_ptr``."""
    WIDE: tl.constexpr = KIND == 3
    ACC: tl.constexpr = tl.float64 if WIDE else tl.float32
    lane_a = tl.zeros([BLOCK], tl.uint32)
    lane_b = tl.zeros([BLOCK], tl.uint32)
    total = tl.zeros([BLOCK], ACC)
    total_sq = tl.zeros([BLOCK], tl.float64)  # squares of values below 2^-63 vanish in float32
    rare_total = tl.zeros([BLOCK], tl.float64)
    rare_sq = tl.zeros([BLOCK], tl.float64)
    count = tl.zeros([BLOCK], tl.int32)
    zeros = tl.zeros([BLOCK], tl.int32)
    under = tl.zeros([BLOCK], tl.int32)
    nans = tl.zeros([BLOCK], tl.int32)
    infs = tl.zeros([BLOCK], tl.int32)
    over = tl.zeros([BLOCK], tl.int32)
    top = tl.full([BLOCK], float("-inf"), ACC)
    neg_bottom = tl.full([BLOCK], float("-inf"), ACC)
    magnitude_top = tl.full([BLOCK], float("-inf"), ACC)
    base_u = base.to(tl.uint32, bitcast=True)
    stride0_u = stride0.to(tl.uint32, bitcast=True)
    stride1_u = stride1.to(tl.uint32, bitcast=True)
    stride2_u = stride2.to(tl.uint32, bitcast=True)
    for tile in range(first, last, step):
        offsets = tile * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        # mode and dims are uniform branches (one per tile), not specialisations: one kernel per element type
        if WIDE:  # float64: lane A reads the low word, lane B the high one
            low = tl.load(x_ptr + 2 * offsets, mask=mask, other=0)
            high = tl.load(x_ptr + 2 * offsets + 1, mask=mask, other=0)
            if mode == 1:
                tl.store(copy_ptr + 2 * offsets, low, mask=mask)
                tl.store(copy_ptr + 2 * offsets + 1, high, mask=mask)
            word_a = low.to(tl.uint32, bitcast=True)
            word_b = high.to(tl.uint32, bitcast=True)
            value = ((high.to(tl.int64) << 32) | (low.to(tl.int64) & 0xFFFFFFFF)).to(tl.float64, bitcast=True)
            if mode == 3:
                value = value / divisor
                divided = value.to(tl.int64, bitcast=True)
                word_a = (divided & 0xFFFFFFFF).to(tl.uint32)
                word_b = ((divided >> 32) & 0xFFFFFFFF).to(tl.uint32)
        else:
            raw = tl.load(x_ptr + offsets, mask=mask, other=0)
            value = _value(raw, KIND)
            word_a = _bits(raw, KIND)
            if mode == 1:
                tl.store(copy_ptr + offsets, raw, mask=mask)
            if mode == 2:  # the float32 difference, computed in registers; its bits are what is fingerprinted
                value = value - _value(tl.load(other_ptr + offsets, mask=mask, other=0), KIND)
                word_a = value.to(tl.uint32, bitcast=True)
            if mode == 3:  # x / divisor in the tensor's own type, as torch divides it on the CPU
                word_a = _rounded_bits(tl.div_rn(value, divisor), KIND)  # IEEE: '/' is approximate on a GPU
                value = _from_bits(word_a, KIND)
            word_b = word_a
        # the element's row-major index in the full tensor, modulo 2^32
        if dims == 1:
            index = base_u + offsets.to(tl.uint32) * stride0_u
        elif dims == 2:
            index = base_u + (offsets // size1).to(tl.uint32) * stride0_u + (offsets % size1).to(tl.uint32) * stride1_u
        else:
            rest = offsets // size2
            index = (base_u + (rest // size1).to(tl.uint32) * stride0_u + (rest % size1).to(tl.uint32) * stride1_u
                     + (offsets % size2).to(tl.uint32) * stride2_u)
        lane_a += tl.where(mask, _mix(word_a, index, 0x9E3779B9, 0x85EBCA6B, 16, 13), 0)
        lane_b += tl.where(mask, _mix(word_b, index, 0x27D4EB2F, 0xC2B2AE35, 15, 16), 0)

        magnitude = tl.abs(value)
        finite = magnitude <= largest_of(ACC)
        count += mask.to(tl.int32)
        zeros += (mask & (value == 0)).to(tl.int32)
        under += (mask & (magnitude > 0) & (magnitude < tiny)).to(tl.int32)
        kept = mask & finite
        top = tl.maximum(top, tl.where(kept, value, float("-inf")))
        neg_bottom = tl.maximum(neg_bottom, tl.where(kept, -value, float("-inf")))
        magnitude_top = tl.maximum(magnitude_top, tl.where(kept, magnitude, float("-inf")))
        rare = mask & ((magnitude > fast_limit) | (value != value))  # NaN, Inf, or past 2^32 or the largest
        if tl.max(rare.to(tl.int32), axis=0) == 0:
            common = tl.where(mask, value, 0.0).to(ACC)
            total += common
            total_sq += common.to(tl.float64) * common.to(tl.float64)
        else:
            nans += (mask & (value != value)).to(tl.int32)
            infs += (mask & (magnitude == float("inf"))).to(tl.int32)
            over += (kept & (magnitude > largest)).to(tl.int32)
            wide = tl.where(kept, value, 0.0).to(tl.float64)
            rare_total += wide
            rare_sq += wide * wide

    tl.store(row_ptr + 0, tl.sum(count, axis=0).to(tl.float64))
    tl.store(row_ptr + 1, tl.sum(total.to(tl.float64), axis=0) + tl.sum(rare_total, axis=0))
    tl.store(row_ptr + 2, tl.sum(total_sq, axis=0) + tl.sum(rare_sq, axis=0))
    tl.store(row_ptr + 3, tl.sum(nans, axis=0).to(tl.float64))
    tl.store(row_ptr + 4, tl.sum(infs, axis=0).to(tl.float64))
    tl.store(row_ptr + 5, tl.sum(zeros, axis=0).to(tl.float64))
    tl.store(row_ptr + 6, tl.sum(under, axis=0).to(tl.float64))
    tl.store(row_ptr + 7, tl.sum(over, axis=0).to(tl.float64))
    tl.store(row_ptr + 8, tl.max(top, axis=0).to(tl.float64))
    tl.store(row_ptr + 9, tl.max(neg_bottom, axis=0).to(tl.float64))
    tl.store(row_ptr + 10, tl.max(magnitude_top, axis=0).to(tl.float64))
    tl.store(row_ptr + 11, tl.sum(lane_a, axis=0).to(tl.float64))
    tl.store(row_ptr + 12, tl.sum(lane_b, axis=0).to(tl.float64))


@triton.jit
def _fold(partials_ptr, first_row, rows, acc_ptr, lanes_ptr, FOLD: tl.constexpr):
    """Add partial rows ``first_row ..`` (``rows`` of them) into the accumulators, always in row order (in blocks
    of ``FOLD``, each a fixed tree): the same bits every run."""
    sums = tl.zeros([16], tl.float64)
    maxima = tl.full([16], float("-inf"), tl.float64)
    columns = tl.arange(0, 16)
    for block in range(0, rows, FOLD):
        index = block + tl.arange(0, FOLD)
        cells = partials_ptr + (first_row + index)[:, None] * 16 + columns[None, :]
        present = (index < rows)[:, None] & (columns < 13)[None, :]
        # from L2 (".cg"): other programs wrote these rows, and this SM's L1 may hold a previous launch's
        sums += tl.sum(tl.load(cells, mask=present, other=0.0, cache_modifier=".cg"), axis=0)
        maxima = tl.maximum(maxima, tl.max(tl.load(cells, mask=present, other=float("-inf"), cache_modifier=".cg"),
                                           axis=0))
    acc = tl.load(acc_ptr + columns, mask=columns < 11, other=0.0, cache_modifier=".cg")
    acc = tl.where(columns < 8, acc + sums, tl.maximum(acc, maxima))
    tl.store(acc_ptr + columns, acc, mask=columns < 11)
    # lanes: each row's sum is below 2^32, and a sum of fewer than 2^21 rows is exact in float64
    words = tl.where((columns >= 11) & (columns < 13), sums, 0.0).to(tl.int64)
    lane_columns = tl.where(columns >= 11, columns - 11, 0)
    lanes = tl.load(lanes_ptr + lane_columns, mask=(columns >= 11) & (columns < 13), other=0, cache_modifier=".cg")
    tl.store(lanes_ptr + lane_columns, (lanes + words) & 0xFFFFFFFF, mask=(columns >= 11) & (columns < 13))


@triton.jit(do_not_specialize=["n", "mode", "dims", "base", "size1", "size2", "stride0", "stride1", "stride2"],
            do_not_specialize_on_alignment=["partials_ptr", "counter_ptr", "acc_ptr", "lanes_ptr"])
def _statistics_kernel(x_ptr, other_ptr, copy_ptr, n, mode, dims, base, size1, size2, stride0, stride1, stride2,
                       divisor, tiny, largest, fast_limit, partials_ptr, counter_ptr, acc_ptr, lanes_ptr,
                       KIND: tl.constexpr, BLOCK: tl.constexpr):
    """One tensor, scalar arguments: each program reads every ``programs``-th tile; the last to finish folds."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles = (n + BLOCK - 1) // BLOCK
    _tiles(x_ptr, other_ptr, copy_ptr, n, pid, tiles, programs, mode, dims, base, size1, size2, stride0, stride1,
           stride2, divisor, tiny, largest, fast_limit, partials_ptr + pid * 16, KIND, BLOCK)
    tl.debug_barrier()  # every thread's partials are written before this program counts itself done
    finished = tl.atomic_add(counter_ptr, 1)  # acq_rel: the last program sees every program's partials
    if finished == programs - 1:
        _fold(partials_ptr, 0, programs, acc_ptr, lanes_ptr, 128)
        tl.atomic_xchg(counter_ptr, 0)  # ready for the next launch on this stream


@triton.jit(do_not_specialize=["tensors", "items", "mode"],
            do_not_specialize_on_alignment=["table_ptr", "partials_ptr", "counters_ptr"])
def _table_kernel(table_ptr, tensors, items, mode, divisor, tiny, largest, fast_limit, partials_ptr, counters_ptr,
                  KIND: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, MAX_TENSORS: tl.constexpr,
                  COLUMNS: tl.constexpr):
    """Many tensors of one type in one launch, described by a table (int64 [tensors, COLUMNS]: pointers to the
    tensor, the other tensor, the copy, the accumulators and the lanes; n, base, size1, size2, stride0..2, dims,
    the row's first item, its group's first item and items, the group). An item is ``CHUNK`` tiles of one tensor.
    Rows that add into the same accumulators (the pieces of one parameter a rank owns) are one group, their items
    side by side: the last item of a group to finish folds all of the group's rows, in order, once."""
    WORD: tl.constexpr = tl.int32 if KIND == 0 or KIND == 3 else tl.int16 if KIND < 3 else tl.uint8
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    rows = tl.arange(0, MAX_TENSORS)
    firsts = tl.load(table_ptr + rows * COLUMNS + 13, mask=rows < tensors, other=2**62)
    for item in range(pid, items, programs):
        tensor = tl.sum((firsts <= item).to(tl.int32), axis=0) - 1
        row = table_ptr + tensor * COLUMNS
        n = tl.load(row + 5).to(tl.int32)
        chunk = (item - tl.load(row + 13)).to(tl.int32)
        group_first = tl.load(row + 14)
        group_items = tl.load(row + 15).to(tl.int32)
        group = tl.load(row + 16).to(tl.int32)
        tiles = (n + BLOCK - 1) // BLOCK
        _tiles(tl.load(row + 0).to(tl.pointer_type(WORD)), tl.load(row + 1).to(tl.pointer_type(WORD)),
               tl.load(row + 2).to(tl.pointer_type(WORD)), n, chunk * CHUNK, tl.minimum((chunk + 1) * CHUNK, tiles), 1,
               mode, tl.load(row + 12).to(tl.int32), tl.load(row + 6).to(tl.int32), tl.load(row + 7).to(tl.int32),
               tl.load(row + 8).to(tl.int32), tl.load(row + 9).to(tl.int32), tl.load(row + 10).to(tl.int32),
               tl.load(row + 11).to(tl.int32), divisor, tiny, largest, fast_limit, partials_ptr + item * 16, KIND,
               BLOCK)
        tl.debug_barrier()
        finished = tl.atomic_add(counters_ptr + group, 1)
        if finished == group_items - 1:
            _fold(partials_ptr, group_first, group_items, tl.load(row + 3).to(tl.pointer_type(tl.float64)),
                  tl.load(row + 4).to(tl.pointer_type(tl.int64)), 128)
            tl.atomic_xchg(counters_ptr + group, 0)


@triton.jit
def largest_of(ACC: tl.constexpr):
    """The largest finite value of the accumulator type (a value past it is an infinity)."""
    if ACC == tl.float64:
        return 1.7976931348623157e308
    else:
        return 3.4028234663852886e38


CHUNK = 16
"""Tiles per item of the table kernel (16 K elements)."""
MAX_TENSORS = 512
"""Tensors per launch of the table kernel (more are launched in several)."""
TABLE_TYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The types the table kernel reads: those of parameters, gradients and optimizer states (a float64 or float8 one
takes a launch of its own)."""


def _stream(device: torch.device) -> int:
    """The stream a launch on ``device`` goes to now (0 on the CPU)."""
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


@functools.cache
def _workspace(device: torch.device, stream: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(partials [MAX_PROGRAMS, 16] float64, counter [1] int32, programs per launch) of ``device`` and one of its
    streams: allocated once, not per launch. Launches on one stream take turns; each stream has its own. The grid
    is the same on every GPU (``PROGRAMS``), so the float sums are the same bits on an A100 and an H200."""
    partials = torch.zeros((MAX_PROGRAMS, _COLUMNS), dtype=torch.float64, device=device)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    return partials, counter, 4 if device.type == "cpu" else PROGRAMS


def shape_rows(shape: tuple[int, ...], rows: tuple[tuple[int, int], ...]) -> tuple[int, list[int], list[int]] | None:
    """(base, sizes, strides) of the element index ``base + sum(position_k * stride_k)`` (modulo 2^32) over
    at most 3 dimensions: size-1 dimensions dropped, neighbours that are contiguous in the full tensor
    merged; None if more than 3 remain."""
    mask = (1 << 32) - 1
    base = sum(offset * stride for offset, stride in rows) & mask
    sizes: list[int] = []
    strides: list[int] = []
    for size, (_, stride) in zip(shape, rows):
        if size == 1:
            continue
        if sizes and strides[-1] & mask == (size * stride) & mask:
            sizes[-1] *= size
            strides[-1] = stride
        else:
            sizes.append(size)
            strides.append(stride)
    if len(sizes) > 3:
        return None
    return base, sizes or [1], strides or [1]


INTERPRETED = bool(triton.knobs.runtime.interpret)
"""Whether this module's kernels were made for Triton's interpreter (``TRITON_INTERPRET=1`` when it was
imported): they then read CPU tensors, and only those."""


def _index_layout(shape: tuple[int, ...], rows: tuple[tuple[int, int], ...]) -> \
        tuple[int, list[int], list[int], int] | None:
    """``shape_rows`` padded to the kernels' three dimensions: (base, sizes, strides, dims before padding)."""
    layout = shape_rows(shape, rows)
    if layout is None:
        return None
    base, sizes, strides = layout
    dims = len(sizes)
    return base, sizes + [1] * (3 - dims), strides + [0] * (3 - dims), dims


def _pairs_with(x: torch.Tensor, before: torch.Tensor | None) -> bool:
    """Whether ``before`` (if any) can be subtracted from ``x`` in the kernel: the same type and shape."""
    return before is None or (before.dtype == x.dtype and before.shape == x.shape)


def takes(x: torch.Tensor) -> bool:
    """Whether the kernel reads ``x``: a CUDA tensor (a CPU one under the interpreter) of a type it knows, of
    fewer than 2^31 elements."""
    words = x.numel() * (2 if x.dtype == torch.float64 else 1)  # a float64 element is read as two int32 words
    return (x.device.type == "cpu" if INTERPRETED else x.is_cuda) and x.dtype in KINDS and words < _LARGEST_INDEX


def accumulate(x: torch.Tensor, rows: tuple[tuple[int, int], ...] | None, tiny: float, largest: float,
               acc: torch.Tensor, lanes: torch.Tensor, *, copy: torch.Tensor | None = None,
               before: torch.Tensor | None = None, divisor: int = 1) -> bool:
    """Add ``x``'s statistics and lanes into ``acc`` (float64 [11]) and ``lanes`` (int64 [2]) in one launch;
    ``rows``: the (offset, stride) in the full tensor of each of x's dimensions (``kernels.host_rows``). With
    ``copy``, also copy x into it in the same read; with ``before`` (x's type and shape), read
    ``float32(x) - float32(before)`` instead; with ``divisor``, read ``x / divisor`` as torch computes it on the CPU
    (in the tensor's type; an activation gradient scaled to the global batch), never materialised. False (nothing
    done) if this kernel does not take the tensor."""
    if divisor != 1 and (x.element_size() == 1 or copy is not None or before is not None):
        return False
    if rows is None or not takes(x) or not _pairs_with(x, before) or x.dtype == torch.float64 and before is not None:
        return False
    if copy is not None and not (x.is_contiguous() and copy.is_contiguous()):
        return False
    x = x.detach().contiguous()  # (a strided activation gradient: one copy, then the one read)
    layout = _index_layout(tuple(x.shape), rows)
    if layout is None:
        return False
    n = x.numel()
    if n == 0:
        return True
    base, sizes, strides, dims = layout
    kind = KINDS[x.dtype]
    words = _WORDS[kind]
    mode = COPY if copy is not None else DIFFERENCE if before is not None else DIVIDED if divisor != 1 else PLAIN
    partials, counter, programs = _workspace(x.device, _stream(x.device))
    grid = (min(programs, triton.cdiv(n, BLOCK)),)
    source = x.reshape(-1).view(words)  # (a 0-d float64 tensor has no int32 view; its flat self has)
    other = source if before is None else before.detach().contiguous().reshape(-1).view(words)
    target = source if copy is None else copy.reshape(-1).view(words)
    try:
        with _launching_on(x.device):
            _statistics_kernel[grid](
                source, other, target, n, mode, dims, to_signed32(base), sizes[1], sizes[2], to_signed32(strides[0]),
                to_signed32(strides[1]), to_signed32(strides[2]), float(divisor), tiny, largest, min(largest, 2.0**32),
                partials, counter, acc, lanes, KIND=kind, BLOCK=BLOCK)
    except Exception as err:  # the launch itself: the kernel cannot be built or run on this device
        raise KernelBuildError(_first_lines(err)) from err
    return True


class KernelBuildError(RuntimeError):
    """A kernel that could not be built (or launched) on this device: the compiler's message."""


def _first_lines(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {' '.join(lines[:3])[:300]}"


def _launching_on(device: torch.device) -> Any:
    """The context a launch for a tensor on ``device`` runs in: Triton launches on the current CUDA device."""
    if device.type != "cuda" or device.index in (None, torch.cuda.current_device()):
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def build(kind: int, capability: int) -> list[Any]:
    """The kernels (one tensor; a table of tensors, for ``TABLE_TYPES``) for the element type ``kind`` (``KINDS``)
    compiled for an
    NVIDIA GPU of compute capability ``capability`` (80: A100, 90: H100 and H200), with no GPU needed: the tests
    build every kernel for both, so that one that cannot be built fails there and not in a user's run."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    words = {torch.int32: "*i32", torch.int16: "*i16", torch.uint8: "*u8"}[_WORDS[kind]]
    signature = {"x_ptr": words, "other_ptr": words, "copy_ptr": words, "partials_ptr": "*fp64",
                 "counter_ptr": "*i32", "acc_ptr": "*fp64", "lanes_ptr": "*i64",
                 **{name: "i32" for name in ("n", "mode", "dims", "base", "size1", "size2", "stride0", "stride1",
                                             "stride2")},
                 **{name: "fp32" for name in ("divisor", "tiny", "largest", "fast_limit")},
                 **{name: "constexpr" for name in ("KIND", "BLOCK")}}
    constants = {"KIND": kind, "BLOCK": BLOCK}
    table_signature = {"table_ptr": "*i64", "tensors": "i32", "items": "i32", "mode": "i32",
                       "partials_ptr": "*fp64", "counters_ptr": "*i32",
                       **{name: "fp32" for name in ("divisor", "tiny", "largest", "fast_limit")},
                       **{name: "constexpr" for name in ("KIND", "BLOCK", "CHUNK", "MAX_TENSORS", "COLUMNS")}}
    table_constants = {"KIND": kind, "BLOCK": BLOCK, "CHUNK": CHUNK, "MAX_TENSORS": MAX_TENSORS,
                       "COLUMNS": _TABLE_COLUMNS}
    target = GPUTarget("cuda", capability, 32)
    built = [triton.compile(ASTSource(_statistics_kernel, signature, constants), target=target)]
    if kind in {KINDS[dtype] for dtype in TABLE_TYPES}:
        built.append(triton.compile(ASTSource(_table_kernel, table_signature, table_constants), target=target))
    return built


_TABLE_COLUMNS = 20


def _items(row: list[int]) -> int:
    """Items (``CHUNK`` tiles each) of a table row's tensor."""
    return triton.cdiv(triton.cdiv(row[5], BLOCK), CHUNK)


def _grouped(members: list[tuple[int, list[int]]]) -> list[tuple[int, list[int]]]:
    """``members`` with the rows that add into the same accumulators side by side, groups in order of first sight
    and rows in their order within each."""
    groups: dict[tuple[int, int], list[tuple[int, list[int]]]] = {}
    for member in members:
        groups.setdefault((member[1][3], member[1][4]), []).append(member)
    return [member for group in groups.values() for member in group]


def table_layout(rows: list[list[int]]) -> list[list[int]]:
    """``rows`` (those of one group side by side) with their items and groups filled in: the row's first item
    (column 13), its group's first item and item count (14, 15) and the group's number (16, its counter)."""
    item, group = 0, -1
    for i, row in enumerate(rows):
        if i == 0 or row[3:5] != rows[i - 1][3:5]:
            group += 1
            first = i
            rows[i][14] = item
        row[13], row[16] = item, group
        row[14] = rows[first][14]
        item += _items(row)
        for member in rows[first:i + 1]:
            member[15] = item - row[14]
    return rows


class _TableSpace:
    """The table kernel's partial rows and per-group counters on one device and stream: grown when a table needs
    more rows (at the first recorded step), never per launch."""

    def __init__(self) -> None:
        self.partials: dict[tuple[torch.device, int], torch.Tensor] = {}
        self.counters: dict[tuple[torch.device, int], torch.Tensor] = {}

    def rows(self, device: torch.device, items: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (device, _stream(device))
        partials = self.partials.get(key)
        if partials is None or partials.shape[0] < items:
            partials = self.partials[key] = torch.zeros((max(items, 4096), _COLUMNS), dtype=torch.float64,
                                                        device=device)
        if key not in self.counters:
            self.counters[key] = torch.zeros(MAX_TENSORS, dtype=torch.int32, device=device)
        return partials, self.counters[key]


_TABLE_SPACE = _TableSpace()


def accumulate_table(entries: list[tuple[torch.Tensor, tuple[tuple[int, int], ...] | None, torch.Tensor,
                                         torch.Tensor, torch.Tensor | None, torch.Tensor | None]],
                     tiny: float, largest: float) -> tuple[list[bool], dict[torch.dtype, str]]:
    """``accumulate`` for each (x, rows, acc, lanes, copy, before) of ``entries`` in as few launches as their types
    and modes allow (one per element type and mode, up to ``MAX_TENSORS`` tensors each): the parameter side's
    hundreds of tensors in a handful of launches. Which entries were read (the others are left to other paths),
    and per element type whose kernel could not be built, the compiler's message (its entries were not read)."""
    taken = [False] * len(entries)
    failures: dict[torch.dtype, str] = {}
    groups: dict[tuple[torch.device, torch.dtype, int], list[tuple[int, list[int]]]] = {}
    keep: list[torch.Tensor] = []
    for i, (x, rows, acc, lanes, copy, before) in enumerate(entries):
        if rows is None or not takes(x) or x.dtype not in TABLE_TYPES or not _pairs_with(x, before):
            continue
        x = x.detach()
        if not x.is_contiguous() or (copy is not None and not copy.is_contiguous()):
            continue
        layout = _index_layout(tuple(x.shape), rows)
        if layout is None:
            continue
        taken[i] = True
        if x.numel() == 0:
            continue
        base, sizes, strides, dims = layout
        other = before.detach().contiguous() if before is not None else x
        keep.append(other)  # a temporary must live until its launch is queued: after it, the stream orders reuse
        mode = COPY if copy is not None else DIFFERENCE if before is not None else PLAIN
        row = [x.data_ptr(), other.data_ptr(), (copy if copy is not None else x).data_ptr(), acc.data_ptr(),
               lanes.data_ptr(), x.numel(), to_signed32(base), sizes[1], sizes[2], to_signed32(strides[0]),
               to_signed32(strides[1]), to_signed32(strides[2]), dims] + [0] * (_TABLE_COLUMNS - 13)
        groups.setdefault((x.device, x.dtype, mode), []).append((i, row))
    for (device, dtype, mode), members in groups.items():
        members = _grouped(members)
        for start in range(0, len(members), MAX_TENSORS):
            table_rows = table_layout([row for _, row in members[start:start + MAX_TENSORS]])
            items = table_rows[-1][13] + _items(table_rows[-1])
            host = torch.tensor(table_rows, dtype=torch.int64, pin_memory=device.type == "cuda")
            table = host.to(device, non_blocking=True)
            partials, counters = _TABLE_SPACE.rows(device, items)
            _, _, programs = _workspace(device, _stream(device))
            try:
                with _launching_on(device):
                    _table_kernel[(min(programs, items),)](
                        table, len(table_rows), items, mode, 1.0, tiny, largest, min(largest, 2.0**32), partials,
                        counters, KIND=KINDS[dtype], BLOCK=BLOCK, CHUNK=CHUNK, MAX_TENSORS=MAX_TENSORS,
                        COLUMNS=_TABLE_COLUMNS)
            except Exception as err:  # the launch itself: nothing of this table was read
                failures[dtype] = _first_lines(err)
                for i, _ in members[start:start + MAX_TENSORS]:
                    taken[i] = False
    return taken, failures

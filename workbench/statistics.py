"""Per-site statistics and fingerprints: their definition, merge rule and a numpy reference.

The recorder computes these on the device (``workbench.recorder.kernels``); this module
says what they are, merges partial results exactly as the recorder does, and gives a
plain numpy implementation that the tests hold the device kernels to. No torch.

Statistics of one tensor, in this order (``STAT_NAMES``):

    count      elements (NaN and Inf included)
    sum        sum of the finite elements (float64)
    sum_sq     sum of squares of the finite elements (float64)
    min, max   over the finite elements (NaN when there is none)
    absmax     largest finite |x|
    l2         sqrt(sum_sq)
    nan, inf   NaN and +-Inf counts
    zero       exact zeros (either sign)
    underflow  finite non-zero |x| below the smallest normal of the run's precision
    overflow   finite |x| above the largest finite value of the run's precision

Fingerprint of one tensor: 64 bits made of two 32-bit lanes, each a sum modulo 2^32 of
one word per element:

    i = full_index mod 2^32,  b = bits(element)   (zero-extended to 32 bits)
    lane A:  v = b XOR i*0x9E3779B9;  v ^= v >> 16;  v *= 0x85EBCA6B;  word = v XOR (v >> 13)
    lane B:  v = b XOR i*0x27D4EB2F;  v ^= v >> 15;  v *= 0xC2B2AE35;  word = v XOR (v >> 16)
    fingerprint = (sum of lane-B words mod 2^32) << 32  |  (sum of lane-A words mod 2^32)

``bits`` is the element's bit pattern (IEEE, or one of the 1-byte float8 formats, e4m3 or
e5m2, zero-extended like the 2-byte types; for 8-byte types lane A reads the low and lane B
the high 32 bits) and ``full_index`` its row-major index in the full, unsharded
tensor. Integer addition is associative, so the value does not depend on reduction
order, and the lane sums of shards add up to the full tensor's; for a fixed index each
word is a bijection of the bits (XOR with a constant, xorshifts, multiplication by an odd
constant), so changing any bit of any single element always changes the fingerprint; the
index term makes it change when elements are permuted. The xorshift before the multiply
matters: without it a flip of the top (sign) bit passes through linearly, as the same
constant at every index, and swapping x with -x would go unseen. 32-bit lanes keep the
multiplications native on vector units (a 64-bit multiply is several instructions).
"""

from __future__ import annotations

import numpy as np

FINGERPRINT_VERSION = 1
"""Version of the fingerprint definition above; golden files that embed fingerprints carry it."""

STAT_NAMES: tuple[str, ...] = ("count", "sum", "sum_sq", "min", "max", "absmax", "l2", "nan", "inf", "zero",
                               "underflow", "overflow")
SUM_STATS: tuple[str, ...] = ("count", "sum", "sum_sq", "nan", "inf", "zero", "underflow", "overflow")
"""Statistics whose shard values add up."""
MAX_STATS: tuple[str, ...] = ("max", "neg_min", "absmax")
"""Statistics whose shard values combine by maximum (``min`` travels as ``-min``)."""

FP_LANES: tuple[tuple[int, int, int, int], ...] = (
    (0x9E3779B9, 0x85EBCA6B, 16, 13),  # lane A: index multiplier, mixing multiplier, shift before, shift after
    (0x27D4EB2F, 0xC2B2AE35, 15, 16),  # lane B
)
_MASK32 = (1 << 32) - 1

PRECISION_LIMITS: dict[str, tuple[float, float]] = {
    # (smallest positive normal, largest finite) of the precision a run computes in
    "fp32": (float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)),
    "bf16": (1.1754943508222875e-38, 3.3895313892515355e38),
    "fp16": (float(np.finfo(np.float16).tiny), float(np.finfo(np.float16).max)),
    "fp8": (2.0**-6, 448.0),  # e4m3
}


def to_signed32(value: int) -> int:
    """An unsigned 32-bit constant as the int32 with the same bits (for torch)."""
    value &= _MASK32
    return value - (1 << 32) if value >= 1 << 31 else value


def element_words(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 32-bit words lanes A and B read from each element (uint32)."""
    flat = np.ascontiguousarray(values).reshape(-1)
    width = flat.dtype.itemsize
    if width == 8:
        words = flat.view(np.uint32).reshape(-1, 2)  # little-endian: low word first
        return words[:, 0].copy(), words[:, 1].copy()
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
    bits = flat.view(unsigned).astype(np.uint32)
    return bits, bits


def lane_sums(values: np.ndarray, full_index: np.ndarray | None = None) -> tuple[int, int]:
    """The two lane sums (mod 2^32) of ``values`` at ``full_index`` (default 0..n-1)."""
    words = element_words(values)
    n = words[0].size
    index = (np.arange(n, dtype=np.uint64) if full_index is None else full_index.reshape(-1)).astype(np.uint32)
    sums = []
    for bits, (index_mult, mix_mult, before, after) in zip(words, FP_LANES):
        with np.errstate(over="ignore"):
            v = bits ^ (index * np.uint32(index_mult))
            v = (v ^ (v >> np.uint32(before))) * np.uint32(mix_mult)
        word = v ^ (v >> np.uint32(after))
        sums.append(int(word.sum(dtype=np.uint64)) & _MASK32)
    return sums[0], sums[1]


def pack_fingerprint(lane_a: int, lane_b: int) -> int:
    """The 64-bit fingerprint (unsigned) from its two lane sums (any integers; taken mod 2^32)."""
    return ((int(lane_b) & _MASK32) << 32) | (int(lane_a) & _MASK32)


def pack_fingerprints(lanes: np.ndarray) -> np.ndarray:
    """``pack_fingerprint`` over an array of lane sums (last axis: lane A, lane B; any integers, taken mod
    2^32): the uint64 fingerprints, of the leading shape."""
    words = np.asarray(lanes).astype(np.uint64) & np.uint64(_MASK32)
    return (words[..., 1] << np.uint64(32)) | words[..., 0]


def fingerprint_reference(values: np.ndarray, full_index: np.ndarray | None = None) -> int:
    """The fingerprint of ``values`` (numpy, any float dtype of 2, 4 or 8 bytes, or the uint8 bit patterns of a
    float8 tensor) as an unsigned int."""
    return pack_fingerprint(*lane_sums(values, full_index))


def combine_fingerprints(*fingerprints: int) -> int:
    """The fingerprint of the union of disjoint pieces: lane-wise sums mod 2^32 (no carry between lanes)."""
    lane_a = sum(int(f) & _MASK32 for f in fingerprints)
    lane_b = sum((int(f) >> 32) & _MASK32 for f in fingerprints)
    return pack_fingerprint(lane_a, lane_b)


def stats_reference(values: np.ndarray, precision: str = "fp32") -> np.ndarray:
    """The ``STAT_NAMES`` vector of ``values`` (float64), computed plainly with numpy."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    finite = np.isfinite(x)
    f = x[finite]
    tiny, largest = PRECISION_LIMITS[precision]
    magnitude = np.abs(f)
    sum_sq = float((f * f).sum())
    return np.array([
        x.size, f.sum(), sum_sq,
        f.min() if f.size else np.nan, f.max() if f.size else np.nan, magnitude.max() if f.size else np.nan,
        np.sqrt(sum_sq), np.isnan(x).sum(), np.isinf(x).sum(), (x == 0).sum(),
        ((magnitude > 0) & (magnitude < tiny)).sum(), (magnitude > largest).sum(),
    ], dtype=np.float64)


def split_partial(stats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A stats vector as its additive part (``SUM_STATS``) and its maximum part (``MAX_STATS``)."""
    index = {name: i for i, name in enumerate(STAT_NAMES)}
    sums = np.array([stats[index[n]] for n in SUM_STATS])
    maxes = np.array([stats[index["max"]], -stats[index["min"]], stats[index["absmax"]]])
    return np.nan_to_num(sums, nan=0.0), np.nan_to_num(maxes, nan=-np.inf)


def assemble(sums: np.ndarray, maxes: np.ndarray) -> np.ndarray:
    """``STAT_NAMES`` vectors from merged additive and maximum parts (last axis), any leading shape.

    ``-inf`` maxima (no finite element contributed) become NaN; ``l2`` is derived here.
    """
    sums = np.asarray(sums, dtype=np.float64)
    maxes = np.where(np.isneginf(maxes), np.nan, np.asarray(maxes, dtype=np.float64))
    s = {name: sums[..., i] for i, name in enumerate(SUM_STATS)}
    out = np.stack([
        s["count"], s["sum"], s["sum_sq"], -maxes[..., 1], maxes[..., 0], maxes[..., 2], np.sqrt(s["sum_sq"]),
        s["nan"], s["inf"], s["zero"], s["underflow"], s["overflow"],
    ], axis=-1)
    empty = s["count"] == 0
    out[empty] = np.nan
    out[empty, 0] = 0.0
    return out


def merge_stats(parts: list[np.ndarray]) -> np.ndarray:
    """Merge ``STAT_NAMES`` vectors of disjoint pieces of one tensor into the whole tensor's vector."""
    split = [split_partial(p) for p in parts]
    sums = np.sum([s for s, _ in split], axis=0)
    maxes = np.max([m for _, m in split], axis=0)
    return assemble(sums, maxes)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def fold_fingerprints(fingerprints: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """One uint64 per site summarising the fingerprints [row, site] of the recorded-step ``rows`` (their row
    numbers in the store): the sum mod 2^64 over rows of splitmix64(fingerprint + (row + 1) * golden ratio).
    Equal rows fold equal; folds that differ mean some row differs; rows that differ fold equal only by a
    64-bit coincidence. A row's number is part of it, so rows that trade places fold differently."""
    keys = (np.asarray(rows, dtype=np.uint64) + np.uint64(1)) * _GOLDEN
    z = np.asarray(fingerprints, dtype=np.uint64) + keys[:, None]
    z = (z ^ (z >> np.uint64(30))) * _MIX[0]
    z = (z ^ (z >> np.uint64(27))) * _MIX[1]
    z ^= z >> np.uint64(31)
    return z.sum(axis=0, dtype=np.uint64)

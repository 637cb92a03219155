"""Exact element-wise measures between two snapshots of one tensor.

    diff = elementwise_difference(a, b, dtype="torch.bfloat16")
    diff.max_abs, diff.relative_l2, diff.ulp_histogram

Snapshots are stored as float32 for 16-bit tensors (exactly: every bf16 and fp16 value
is a float32 value), so distances in units in the last place (ULP) are counted in the
precision the tensor had in training: ``dtype`` names it. The ULP distance of two
finite values of one format is the number of representable values between them, from
the bit patterns mapped to a monotonic integer line (so -0.0 and +0.0 are 0 apart).
NaN against anything, or an infinity against a finite value, counts as "not comparable".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.errors import WorkbenchError

_ULP_FORMATS: dict[str, tuple[type[np.generic], type[np.generic], int]] = {
    # training dtype -> (float type compared in, same-width signed int type, bits dropped from it)
    "float64": (np.float64, np.int64, 0),
    "float32": (np.float32, np.int32, 0),
    "bfloat16": (np.float32, np.int32, 16),  # bf16 is the top half of a float32
    "float16": (np.float16, np.int16, 0),
}


@dataclass(frozen=True)
class ElementwiseDifference:
    count: int
    differing: int
    """Elements whose bit patterns differ."""
    max_abs: float
    relative_l2: float
    """||a - b|| / ||a|| over finite elements (0 when equal, inf when ||a|| = 0 and they differ)."""
    not_comparable: int
    ulp_histogram: pd.Series
    """Number of elements per ULP-distance bin ("0", "1", "2-3", "4-7", ...)."""

    @property
    def identical(self) -> bool:
        return self.differing == 0


def _format(dtype: str) -> tuple[type[np.generic], type[np.generic], int]:
    key = dtype.removeprefix("torch.")
    if key not in _ULP_FORMATS:
        raise WorkbenchError(f"no ULP distance for dtype {dtype!r}; known: {', '.join(_ULP_FORMATS)}")
    return _ULP_FORMATS[key]


def ulp_distance(a: np.ndarray, b: np.ndarray, dtype: str = "float32") -> np.ndarray:
    """int64 ULP distance per element in the format ``dtype``; -1 where not comparable."""
    float_type, int_type, dropped = _format(dtype)
    x, y = np.asarray(a).astype(float_type), np.asarray(b).astype(float_type)

    def ordered(values: np.ndarray) -> np.ndarray:
        bits = values.view(int_type).astype(np.int64) >> dropped
        lowest = np.int64(-(2 ** (8 * np.dtype(int_type).itemsize - dropped - 1)))  # the pattern of -0.0
        return np.where(bits < 0, lowest - bits, bits)  # sign-magnitude -> one monotonic line, -0.0 -> 0

    distance = np.abs(ordered(x) - ordered(y))
    comparable = (np.isfinite(x) & np.isfinite(y)) | ((x == y) & ~np.isnan(x))
    return np.where(comparable, distance, -1)


def _ulp_bins(distance: np.ndarray) -> pd.Series:
    finite = distance[distance >= 0]
    top = int(finite.max()) if finite.size else 0
    edges = [0, 1] + [2**k for k in range(1, max(1, top.bit_length()) + 1)]
    labels = ["0", "1"] + [f"{2**k}-{2**(k + 1) - 1}" for k in range(1, len(edges) - 1)]
    counts = np.histogram(finite, bins=[*edges, max(edges[-1], top) + 1])[0] if finite.size else np.zeros(len(edges))
    series = pd.Series(counts[:len(labels)], index=pd.Index(labels, name="ulp"), dtype=int)
    return series.loc[: series[series > 0].index[-1]] if (series > 0).any() else series.iloc[:1]


def elementwise_difference(a: np.ndarray, b: np.ndarray, dtype: str = "float32") -> ElementwiseDifference:
    """Measures between two snapshots ``a`` (reference) and ``b`` of one shape."""
    if np.shape(a) != np.shape(b):
        raise WorkbenchError(f"snapshots of different shapes {np.shape(a)} and {np.shape(b)} cannot be compared")
    distance = ulp_distance(a, b, dtype).ravel()
    x, y = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    finite = np.isfinite(x) & np.isfinite(y)
    delta = np.abs(x[finite] - y[finite])
    norm = float(np.linalg.norm(x[finite]))
    diff_norm = float(np.linalg.norm(delta))
    relative = diff_norm / norm if norm > 0 else (0.0 if diff_norm == 0 else float("inf"))
    return ElementwiseDifference(count=x.size, differing=int((distance != 0).sum()),
                                 max_abs=float(delta.max()) if delta.size else 0.0, relative_l2=relative,
                                 not_comparable=int((distance < 0).sum()), ulp_histogram=_ulp_bins(distance))

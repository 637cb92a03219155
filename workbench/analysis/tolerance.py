"""What a tolerance means: a difference measured against the quantity's own scale.

The one definition the tolerant golden check (``workbench check --rtol``) and golden files
use. A relative difference of each statistic against itself is meaningless where the
statistic sits near zero: the minimum of squared tiny gradients, the sum of a centred
activation. Reduction order (another CPU's vector width, another layout) moves such a
value by a large fraction of itself while the tensor changed by a rounding error. So:

* **A site's statistic** at a step passes when ``|a - b| <= rtol * scale``, where the scale
  belongs to the tensor, taken as the larger of the two runs' values:

  ===================  =========================================================
  statistic            scale
  ===================  =========================================================
  mean (sum / n)       RMS (sqrt(sum_sq / n)): \\|mean\\| <= RMS always
  RMS                  RMS (so this one is the ordinary relative difference)
  min, max, absmax     absmax: the extremes are held to the tensor's largest value
  nan, inf counts      must be equal
  ===================  =========================================================

  ``n`` counts the finite elements. A tensor that is zero in both runs (scale 0) passes
  only when the values are equal.
* **A per-step scalar** (loss, grad norm) passes at a step when
  ``|a - b| <= rtol * mean(mean |a|, mean |b|)`` over the checked steps: the threshold
  Megatron-LM's functional tests apply to their golden values (``approximate_threshold``:
  an absolute tolerance of ``rtol`` times the trajectory's mean). Both NaN is equal.

The result of each is a *normalised difference* ``|a - b| / scale`` (0 where equal,
inf where only one side is NaN or a count differs), so ``normalised <= rtol`` is the test.
"""

from __future__ import annotations

import numpy as np

from workbench.statistics import STAT_NAMES

TOLERANCE_QUANTITIES: tuple[str, ...] = ("mean", "rms", "min", "max", "absmax", "nan", "inf")
"""What the tolerant check holds to ``rtol``, in this order (derived from ``STAT_NAMES``)."""
TOLERANCE_SCALARS: tuple[str, ...] = ("loss", "grad_norm")
"""Per-step scalars the golden check holds, bitwise or to ``rtol`` (Megatron's threshold)."""

_SCALE_OF = {"mean": "rms", "rms": "rms", "min": "absmax", "max": "absmax", "absmax": "absmax"}
_COUNTS = ("nan", "inf")


def _quantities(stats: np.ndarray) -> dict[str, np.ndarray]:
    """mean, rms, min, max, absmax, nan, inf of statistics ``stats`` [..., stat] (``STAT_NAMES`` order)."""
    def stat(name: str) -> np.ndarray:
        return stats[..., STAT_NAMES.index(name)]

    with np.errstate(invalid="ignore", divide="ignore"):
        finite = stat("count") - stat("nan") - stat("inf")
        n = np.where(finite > 0, finite, np.nan)
        out = {"mean": stat("sum") / n, "rms": np.sqrt(stat("sum_sq") / n)}
    out.update({name: stat(name) for name in ("min", "max", "absmax", *_COUNTS)})
    return out


def _normalised(a: np.ndarray, b: np.ndarray, scale: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        diff = np.abs(a - b)
        out = np.where(scale > 0, diff / np.where(scale > 0, scale, 1.0), np.where(diff == 0, 0.0, np.inf))
    both_nan = np.isnan(a) & np.isnan(b)
    one_nan = np.isnan(a) != np.isnan(b)
    out = np.where(a == b, 0.0, out)
    out = np.where(both_nan, 0.0, np.where(one_nan, np.inf, out))
    return np.where(np.isnan(out), np.inf, out)  # inf - inf of equal sign is handled by a == b above


def site_differences(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Normalised differences [..., quantity] (``TOLERANCE_QUANTITIES``) of two runs' statistics [..., stat]."""
    qa, qb = _quantities(a), _quantities(b)
    columns = []
    for name in TOLERANCE_QUANTITIES:
        if name in _COUNTS:
            columns.append(np.where((qa[name] == qb[name]) | (np.isnan(qa[name]) & np.isnan(qb[name])), 0.0, np.inf))
            continue
        scale_name = _SCALE_OF[name]
        scale = np.fmax(np.abs(qa[scale_name]), np.abs(qb[scale_name]))
        columns.append(_normalised(qa[name], qb[name], scale))
    return np.stack(columns, axis=-1)


def scalar_differences(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Normalised differences per step of two runs' values of one scalar over the checked steps."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    with np.errstate(invalid="ignore"):
        scale = 0.5 * (np.nanmean(np.abs(a)) + np.nanmean(np.abs(b))) if np.isfinite(a).any() and \
            np.isfinite(b).any() else np.nan
    return _normalised(a, b, np.full(a.shape, scale if np.isfinite(scale) else 0.0))

"""Element-wise snapshot measures: ULP distances against hand-counted answers."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.analysis.elementwise import elementwise_difference, ulp_distance
from workbench.errors import WorkbenchError


def test_ulp_distance_float32_counts_representable_values() -> None:
    one = np.float32(1.0)
    up2 = np.nextafter(np.nextafter(one, np.float32(2)), np.float32(2))
    a = np.array([one, one, -0.0, 0.0, -1.0, np.nan, np.inf], dtype=np.float32)
    tiny = np.nextafter(np.float32(0), np.float32(1))
    b = np.array([one, up2, 0.0, tiny, np.nextafter(np.float32(-1), np.float32(0)), 1.0, np.inf], dtype=np.float32)
    assert ulp_distance(a, b).tolist() == [0, 2, 0, 1, 1, -1, 0]
    # across zero: the smallest negative and smallest positive subnormal are two apart
    tiny = np.nextafter(np.float32(0), np.float32(1))
    assert ulp_distance(np.array([-tiny]), np.array([tiny]), "float32").tolist() == [2]


def test_ulp_distance_in_bfloat16_units() -> None:
    # bf16 keeps the top 16 bits of a float32: the next bf16 after 1.0 is 1 + 2**-7
    a = np.array([1.0, 1.0, -2.0], dtype=np.float32)
    b = np.array([1.0 + 2**-7, 1.0 + 2 * 2**-7, -2.0 - 2**-6], dtype=np.float32)
    assert ulp_distance(a, b, "torch.bfloat16").tolist() == [1, 2, 1]
    assert ulp_distance(a, b, "float32").tolist() == [2**16, 2**17, 2**16]


def test_elementwise_difference_measures() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((32, 16)).astype(np.float32)
    b = a.copy()
    b[3, 4] = np.nextafter(b[3, 4], np.float32(np.inf))
    b[5, 5] += 0.5
    diff = elementwise_difference(a, b)
    assert diff.count == 512 and diff.differing == 2 and not diff.identical
    assert diff.max_abs == pytest.approx(0.5, rel=1e-6)
    assert diff.relative_l2 == pytest.approx(np.linalg.norm(b.astype(float) - a) / np.linalg.norm(a.astype(float)))
    assert diff.ulp_histogram["0"] == 510 and diff.ulp_histogram["1"] == 1 and diff.ulp_histogram.sum() == 512
    same = elementwise_difference(a, a.copy())
    assert same.identical and same.max_abs == 0 and same.relative_l2 == 0 and list(same.ulp_histogram.index) == ["0"]


def test_bad_inputs() -> None:
    with pytest.raises(WorkbenchError, match="shapes"):
        elementwise_difference(np.zeros(3), np.zeros(4))
    with pytest.raises(WorkbenchError, match="dtype"):
        ulp_distance(np.zeros(3), np.zeros(3), "int8")

from __future__ import annotations

import numpy as np

from workbench.statistics import (
    STAT_NAMES,
    assemble,
    combine_fingerprints,
    fingerprint_reference,
    pack_fingerprint,
    stats_reference,
)


def test_lanes_combine_without_carry() -> None:
    a = pack_fingerprint(0xFFFFFFFF, 1)
    b = pack_fingerprint(1, 1)
    assert combine_fingerprints(a, b) == pack_fingerprint(0, 2)  # lane A wraps, lane B untouched


def test_reference_statistics() -> None:
    x = np.array([1.0, -2.0, 0.0, np.nan, np.inf, 1e-41, 7e4], dtype=np.float32)
    stats = dict(zip(STAT_NAMES, stats_reference(x, "fp16")))
    assert stats["count"] == 7 and stats["nan"] == 1 and stats["inf"] == 1 and stats["zero"] == 1
    assert stats["min"] == -2.0 and stats["max"] == np.float32(7e4) and stats["absmax"] == np.float32(7e4)
    assert stats["underflow"] == 1   # 1e-41 is below fp16's smallest normal
    assert stats["overflow"] == 1    # 7e4 is above fp16's largest finite value
    assert np.isclose(stats["l2"], np.sqrt(stats["sum_sq"]))


def test_assemble_marks_empty_sites() -> None:
    stats = assemble(np.zeros((2, 8)), np.full((2, 3), -np.inf))
    assert (stats[:, 0] == 0).all() and np.isnan(stats[:, 1:]).all()


def test_fingerprint_of_known_values_is_stable() -> None:
    # Pinned value: a change to the definition must be deliberate (it breaks stored stores).
    assert fingerprint_reference(np.arange(4, dtype=np.float32)) == 0x70396C91_654A7D80
    assert fingerprint_reference(np.zeros(3, np.float32)) != fingerprint_reference(np.zeros(4, np.float32))

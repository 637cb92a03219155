"""Synthetic run stores: real stores with a known divergence."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.analysis import compare
from workbench.store.reader import list_runs, open_run
from workbench.store.synthetic import SITES_PER_LAYER, synthetic_sites, write_synthetic_run


def test_sites_follow_execution_order() -> None:
    sites = synthetic_sites(2 * SITES_PER_LAYER)
    kinds = [s.kind for s in sites]
    assert kinds[0] == "param" and kinds[-1] == "update" and len(sites) == 2 * SITES_PER_LAYER
    acts = [s.name for s in sites if s.kind == "act"]
    assert acts[0].startswith("layers.0") and acts[-1] == "layers.1"
    assert [s.order for s in sites] == list(range(len(sites)))


def test_pair_diverges_exactly_where_asked(tmp_path: Path) -> None:
    a = write_synthetic_run(tmp_path / "a", steps=70, sites=60, seed=3)
    b = write_synthetic_run(tmp_path / "b", steps=70, sites=60, seed=3, diverge_at=(66, 41))
    same = write_synthetic_run(tmp_path / "c", steps=70, sites=60, seed=3)
    ra, rb = open_run(a).records(), open_run(b).records()
    result = compare(ra, rb)
    assert result.first_step == 66 and result.first_site == ra.sites[41]
    assert result.frontier[ra.sites[41]] == 66 and result.frontier[ra.sites[0]] == 67
    assert compare(ra, open_run(same).records()).identical
    assert set(list_runs(tmp_path)["status"]) == {"complete"}


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="outside"):
        write_synthetic_run("/tmp/never-written", steps=5, sites=5, diverge_at=(5, 0))

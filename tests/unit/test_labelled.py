"""A run's statistics and fingerprints, and two runs' differences, as labelled xarray objects."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workbench.analysis import compare, labelled_difference
from workbench.errors import ArgumentError
from workbench.store.reader import open_run
from workbench.store.synthetic import write_synthetic_run


@pytest.mark.parametrize("schema_version", [2, 3])
def test_a_run_and_a_pair_are_labelled_by_step_and_site(tmp_path: Path, schema_version: int) -> None:
    a = open_run(write_synthetic_run(tmp_path / "a", steps=9, sites=6, seed=1, schema_version=schema_version))
    b = open_run(write_synthetic_run(tmp_path / "b", steps=9, sites=6, seed=1, diverge_at=(4, 2),
                                     schema_version=schema_version))
    short = open_run(write_synthetic_run(tmp_path / "short", steps=7, sites=6, seed=1,
                                         schema_version=schema_version))
    ds = a.sites()
    assert set(ds.data_vars) == {"stats", "fingerprint"} and set(ds.dims) == {"step", "site", "stat"}
    assert list(ds["step"].values) == list(range(9)) and list(ds["site"].values) == a.site_names()
    site = a.site_names()[3]
    assert float(ds["stats"].sel(step=2, site=site, stat="l2")) == a.stat("l2").loc[2, site]
    assert ds.attrs["run"] == "a" and "kind" in ds.coords
    kinds = a.site_table()["kind"]
    assert dict(ds.where(ds.kind == kinds.iloc[0], drop=True).sizes)["site"] == int((kinds == kinds.iloc[0]).sum())

    assert list(labelled_difference(ds, short.sites())["step"].values) == list(range(7))  # the steps both have
    diff = labelled_difference(ds, b.sites())
    assert diff.attrs == {"a": "a", "b": "b"} and diff["relative"].dims == ("step", "site", "stat")
    result = compare(a.records(), b.records())
    unequal = ~diff["equal"].to_pandas()
    first = unequal[unequal.any(axis=1)].index[0]
    assert first == result.first_step == 4
    assert unequal.loc[4].idxmax() == result.first_site  # execution order: the first unequal column
    relative, differs = diff["relative"].sel(stat="l2").to_numpy(), unequal.to_numpy()
    assert (relative[~differs] == 0).all() and (relative[differs] > 0).all()
    assert np.isfinite(diff["relative"].sel(stat="l2").values).all()
    with pytest.raises(ArgumentError, match="Run.sites"):
        labelled_difference(ds[["stats"]], b.sites())

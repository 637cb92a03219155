"""analysis.replay_check on synthetic stores: reproduced, departed (site, then scalar), nondeterministic."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.analysis.replay_check import replay_check
from workbench.store.reader import open_run
from workbench.store.synthetic import write_synthetic_run


def _pair(tmp_path: Path, diverge_at: tuple[int, int] | None) -> tuple:
    a = open_run(write_synthetic_run(tmp_path / "a", steps=10, sites=8, name="orig"))
    b = open_run(write_synthetic_run(tmp_path / "b", steps=10, sites=8, name="replay", diverge_at=diverge_at))
    return a, b


def test_a_bitwise_equal_replay_reproduces(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, None)
    check = replay_check(a.records(), b.records(), a.scalars, b.scalars, from_step=4, to_step=7, deterministic=True)
    assert check.reproduced and check.steps == [4, 5, 6, 7] and check.sites == len(a.records().sites)
    assert (check.closeness.to_numpy() == 0).all()
    assert "reproduces the original" in check.summary()


def test_the_first_departing_step_and_site_are_named(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, (6, 5))
    site = a.records().sites[5]
    check = replay_check(a.records(), b.records(), a.scalars, b.scalars, from_step=4, to_step=8, deterministic=True)
    assert not check.reproduced
    assert (check.first_step, check.first_site) == (6, site)
    assert check.closeness.loc[6, "max_site_rel"] > 0 and check.closeness.loc[5, "max_site_rel"] == 0
    # Outside the replayed span a difference does not count.
    early = replay_check(a.records(), b.records(), a.scalars, b.scalars, from_step=0, to_step=5,
                         deterministic=True)
    assert early.reproduced


def test_scalars_alone_and_a_nondeterministic_run(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, None)
    scalars = b.scalars.copy()
    scalars.loc[5, "loss"] = np.nextafter(scalars.loc[5, "loss"], np.inf)  # one ULP
    check = replay_check(None, None, a.scalars, scalars, from_step=2, to_step=6, deterministic=False)
    assert (check.first_step, check.first_site) == (5, "loss")
    assert 0 < check.closeness.loc[5, "loss_rel"] < 1e-15
    assert "nondeterministic" in check.summary() and "cannot be expected" in check.summary()
    assert check.to_dict()["closeness"][5]["loss_rel"] > 0


def test_a_replay_compared_on_scalars_alone_says_so(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, None)
    alone = replay_check(None, None, a.scalars, b.scalars, from_step=4, to_step=7, deterministic=True)
    assert alone.sites == 0 and alone.sites_not_compared == "a run has no per-site records"
    assert "no site was compared" in alone.summary() and "bitwise identical:" not in alone.summary()
    other = open_run(write_synthetic_run(tmp_path / "c", steps=10, sites=8, name="other"))
    shape = other.records()
    renamed = type(shape)(shape.name, shape.fingerprints.set_axis([f"act:x{i}" for i in range(8)], axis=1),
                          shape.stats.assign_coords(site=[f"act:x{i}" for i in range(8)]), shape.model)
    disjoint = replay_check(a.records(), renamed, a.scalars, other.scalars, from_step=4, to_step=7,
                            deterministic=True)
    assert disjoint.sites == 0 and "no site in common" in (disjoint.sites_not_compared or "")
    assert disjoint.to_dict()["sites_not_compared"] == disjoint.sites_not_compared

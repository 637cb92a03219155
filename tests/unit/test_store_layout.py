"""Schema 3: statistics kept apart in shards; older stores read the same, and upgrade in place."""

from __future__ import annotations

import errno
import os
import shutil
import socket
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

from workbench.analysis import compare
from workbench.cli import main
from workbench.errors import ArgumentError, DamagedStoreError, RunNotFoundError
from workbench.statistics import STAT_NAMES
from workbench.store import layout, upgrade
from workbench.store.blocks import block_frontier
from workbench.store.reader import Run, open_run
from workbench.store.synthetic import synthetic_sites, write_synthetic_run
from workbench.store.upgrade import upgrade_plan, upgrade_store
from workbench.store.writer import (
    SiteWriter,
    create_sites_group,
    create_store,
    reclaim_leftovers,
    set_status,
    update_manifest,
)
from workbench.studies.comparing import compare_runs
from workbench.studies.holding import KEPT_STATISTICS
from workbench.studies.workspace import Workspace

STEPS, SITES = 150, 600  # three shards, the last one partly filled; one statistic per chunk from 512 sites on


@pytest.mark.parametrize(("sites", "per_chunk"), [(1000, 1), (600, 1), (300, 2), (100, 6), (12, 12)])
def test_schema_3_puts_as_few_statistics_in_a_chunk_as_keep_it_large(sites: int, per_chunk: int) -> None:
    chunking = layout.site_chunking(3, 10_000, sites, 12)
    assert chunking == {"chunks": (64, sites, per_chunk), "shards": (64, sites, 12)}
    assert layout.site_chunking(2, 10_000, sites, 12) == {"chunks": (64, sites, 12)}


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    old = write_synthetic_run(tmp_path / "v2" / "a", steps=STEPS, sites=SITES, seed=4, schema_version=2)
    new = write_synthetic_run(tmp_path / "v3" / "a", steps=STEPS, sites=SITES, seed=4)
    return old, new


def _same_records(a: Path, b: Path) -> None:
    ra, rb = open_run(a), open_run(b)
    assert ra.fingerprints().equals(rb.fingerprints())
    np.testing.assert_array_equal(ra.records().stats.load(), rb.records().stats.load())
    for stat in ("l2", "max", STAT_NAMES[-1]):
        assert ra.stat(stat).equals(rb.stat(stat))
        np.testing.assert_array_equal(ra.statistic(stat), rb.statistic(stat))
    assert ra.site_table().equals(rb.site_table())
    assert ra.recorded_steps_completed == rb.recorded_steps_completed
    np.testing.assert_array_equal(ra.sites()["stats"].to_numpy(), rb.sites()["stats"].to_numpy())


def test_a_v2_store_reads_the_same_as_the_v3_store_of_the_same_run(tmp_path: Path) -> None:
    old, new = _pair(tmp_path)
    assert open_run(old).attrs["schema_version"] == 2 and not open_run(old).reads_statistics_apart
    assert open_run(new).attrs["schema_version"] == 3 and open_run(new).reads_statistics_apart
    stats = zarr.open_array(layout.RunPaths(new).store / "sites" / "stats", mode="r")
    assert stats.chunks == (64, SITES, 1) and stats.shards == (64, SITES, 12)
    files = [p for p in (layout.RunPaths(new).store / "sites" / "stats" / "c").rglob("*") if p.is_file()]
    assert len(files) == 3  # one file per 64 recorded steps, as in schema 2
    _same_records(old, new)


def test_the_writer_gives_the_same_store_flush_by_flush_and_after_reopening(tmp_path: Path) -> None:
    _, whole = _pair(tmp_path)
    reference = open_run(whole)
    stats = reference.records().stats.load().to_numpy()
    fingerprints = reference.fingerprints().to_numpy()
    run_dir = tmp_path / "flushed"
    create_store(run_dir, {**reference.attrs, "status": layout.Status.RUNNING}, STEPS)  # no scalar rows: not complete
    create_sites_group(run_dir, list(range(STEPS)), synthetic_sites(SITES))
    writer = SiteWriter(run_dir)
    writer.write(0, stats[:30] + 1, fingerprints[:30] + np.uint64(1))  # rows a resumed run writes again below
    writer = SiteWriter(run_dir)
    for first in range(0, 98, 7):  # flushes of 7 steps (rows 0-97), across the shards' bounds
        writer.write(first, stats[first:first + 7], fingerprints[first:first + 7])
    writer = SiteWriter(run_dir)  # a resumed writer, in the middle of a shard
    for first in range(105, STEPS, 5):
        writer.write(first, stats[first:first + 5], fingerprints[first:first + 5])
    run = open_run(run_dir)
    assert run.recorded_steps_completed == 98  # rows 105.. are written too: 98 is the first gap
    writer.write(98, stats[98:105], fingerprints[98:105])
    _same_records(run_dir, whole)
    for name in (layout.BIN_FINGERPRINT_ARRAY, layout.BIN_ROWS_ARRAY):  # the folds, flush by flush, as written whole
        flushed, expected = (zarr.open_array(layout.RunPaths(d).store / "sites" / name, mode="r")[:]
                             for d in (run_dir, whole))
        np.testing.assert_array_equal(flushed, expected)


def test_a_shard_written_whole_is_not_undone_by_a_later_flush_into_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    create_store(run_dir, {"run_id": "r", "name": "r", "producer": "test"}, 64)
    create_sites_group(run_dir, list(range(64)), synthetic_sites(SITES))
    stats = np.random.default_rng(0).standard_normal((64, SITES, len(STAT_NAMES)))
    fingerprints = np.arange(64 * SITES, dtype=np.uint64).reshape(64, SITES)
    writer = SiteWriter(run_dir)
    writer.write(0, stats[:10] - 1, fingerprints[:10])  # the shard's rows now in the writer's memory
    writer.write(0, stats, fingerprints)  # the whole shard, newer
    writer.write(60, stats[60:], fingerprints[60:])  # a flush into it again
    np.testing.assert_array_equal(open_run(run_dir).records().stats.to_numpy(), stats)


def test_a_deleted_or_truncated_shard_of_a_written_row_is_damage(tmp_path: Path) -> None:
    _, run_dir = _pair(tmp_path)
    shard = layout.RunPaths(run_dir).store / "sites" / "stats" / "c" / "1" / "0" / "0"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(DamagedStoreError, match="sites/stats: a chunk cannot be read"):
        open_run(run_dir).statistic("l2")
    shard.unlink()
    with pytest.raises(DamagedStoreError, match=r"sites/stats: the chunk of rows 64-127 is missing"):
        open_run(run_dir).statistic("l2")
    with pytest.raises(DamagedStoreError, match=r"rows 64-127 is missing"):
        open_run(run_dir).records()


def test_upgrade_rewrites_a_v2_store_in_place_and_it_reads_the_same(tmp_path: Path) -> None:
    old, new = _pair(tmp_path)
    before = open_run(old)
    fingerprints, stats = before.fingerprints(), before.records().stats.load()
    plan = upgrade_store(old)
    assert plan.schema_version == 2 and plan.rewrite_bytes > STEPS * SITES * 8  # at least the fingerprints
    after = open_run(old)
    assert after.attrs["schema_version"] == 3 and after.attrs["upgraded"]["from_schema"] == 2
    assert after.reads_statistics_apart
    assert after.fingerprints().equals(fingerprints)
    np.testing.assert_array_equal(after.records().stats.load(), stats)
    _same_records(old, new)
    for name in (layout.BIN_FINGERPRINT_ARRAY, layout.BIN_ROWS_ARRAY):  # folded as the recorder folds them
        upgraded, written = (zarr.open_array(layout.RunPaths(d).store / "sites" / name, mode="r")[:]
                             for d in (old, new))
        np.testing.assert_array_equal(upgraded, written)
    assert not upgrade_plan(after).needed and upgrade_store(old).schema_version == 3  # nothing more to do
    assert not [p for p in old.rglob(".*")]  # no staging folder left behind


def test_upgrade_keeps_a_killed_runs_unwritten_rows_unwritten(tmp_path: Path) -> None:
    source = open_run(write_synthetic_run(tmp_path / "full", steps=STEPS, sites=SITES, seed=2, schema_version=2))
    run_dir = tmp_path / "killed"
    create_store(run_dir, dict(source.attrs), STEPS, schema_version=2)
    create_sites_group(run_dir, list(range(STEPS)), synthetic_sites(SITES))
    stats, fingerprints = source.records().stats.load().to_numpy(), source.fingerprints().to_numpy()
    SiteWriter(run_dir).write(0, stats[:70], fingerprints[:70])
    set_status(run_dir, layout.Status.FAILED)
    upgrade_store(run_dir)
    run = open_run(run_dir)
    assert run.recorded_steps_completed == 70
    done = zarr.open_array(layout.RunPaths(run_dir).store / "sites" / "done", mode="r")[:]
    assert done[:70].all() and not done[70:].any()
    np.testing.assert_array_equal(run.statistic("l2").to_numpy(), source.statistic("l2").to_numpy()[:70])


def test_upgrade_refuses_a_store_still_being_written_and_a_full_disk(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    old, _ = _pair(tmp_path)
    update_manifest(old, status="running", launcher={"pid": os.getpid(), "host": socket.gethostname()})
    assert main(["upgrade", str(old)]) == 2
    assert "the run is running: its producer still writes the store" in capsys.readouterr().err
    set_status(old, layout.Status.COMPLETE)

    assert main(["upgrade", str(old), "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "schema 2 -> 3; rewrites its per-site records (" in said and " MB free)" in said
    assert open_run(old).attrs["schema_version"] == 2

    monkeypatch.setattr(upgrade.shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10**9, 10**9 - 1, 1))
    with pytest.raises(ArgumentError, match="not enough room; free .* MB more on that filesystem"):
        upgrade_store(old)
    assert open_run(old).attrs["schema_version"] == 2 and not open_run(old).reads_statistics_apart


def test_upgrade_asks_for_at_least_the_room_its_copy_takes(tmp_path: Path) -> None:
    old, _ = _pair(tmp_path)
    sites = layout.RunPaths(old).store / "sites"
    before = sum(f.stat().st_size for f in sites.rglob("*") if f.is_file())
    plan = upgrade_store(old)
    after = sum(f.stat().st_size for f in sites.rglob("*") if f.is_file())
    # the rewritten group was larger than the old one (20.7 MB over 42.6 MB on the demo: the check passed, the
    # disk filled); the plan asks for what the copy can take, not for the old group's size
    assert plan.rewrite_bytes >= after, (plan.rewrite_bytes, before, after)


def test_a_disk_that_fills_during_an_upgrade_is_one_line_and_the_store_is_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    old, _ = _pair(tmp_path)
    before = open_run(old).records().stats.load()
    def full(self: SiteWriter, *args: object) -> None:  # the copy's group is made; its rows meet a full disk
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(upgrade.SiteWriter, "write", full)
    assert main(["upgrade", str(old)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "the disk filled" in err and "the store is unchanged" in err
    run = open_run(old)
    assert run.attrs["schema_version"] == 2 and run.records().stats.load().equals(before)
    assert not [p for p in old.iterdir() if p.name.startswith(".")]  # the copy is removed


def test_what_a_killed_upgrade_left_is_reclaimed_by_the_next_writer(tmp_path: Path) -> None:
    old, _ = _pair(tmp_path)
    sites = layout.RunPaths(old).store / "sites"
    dead = 2**22 + 12345  # above Linux's default pid_max: no process has it
    staging = old / f".sites.creating-{dead}"
    shutil.copytree(sites, staging)  # a copy half made
    before = open_run(old).records().stats.load()
    upgrade_store(old)
    assert not staging.exists() and open_run(old).records().stats.load().equals(before)
    # killed between the two renames: the original set aside, its copy not yet in place
    set_aside = old / f".sites.replaced-{dead}"
    os.rename(sites, set_aside)
    assert reclaim_leftovers(old, sites) == [set_aside]
    assert sites.is_dir() and not set_aside.exists() and open_run(old).records().stats.load().equals(before)


def test_what_a_killed_run_left_beside_its_store_is_reclaimed_by_the_next_run(tmp_path: Path) -> None:
    """A run killed while its store was being built leaves ``.run.zarr.creating-PID``; the next writer of the
    folder (which holds its lock) removes it, and leaves alone one of a process still alive."""
    run_dir = tmp_path / "run"
    dead, alive = run_dir / f".run.zarr.creating-{2**22 + 12345}", run_dir / f".run.zarr.creating-{os.getppid()}"
    for leftover in (dead, alive):
        (leftover / "scalars").mkdir(parents=True)
    write_synthetic_run(run_dir, steps=4)
    assert not dead.exists() and alive.exists() and open_run(run_dir).status == "complete"


def test_the_workspace_keeps_few_statistics_of_a_run_that_reads_them_apart(tmp_path: Path) -> None:
    old, new = _pair(tmp_path)
    write_synthetic_run(tmp_path / "v3" / "b", steps=STEPS, sites=SITES, seed=4, diverge_at=(20, 5))
    ws = Workspace.open(tmp_path / "v3")
    assert ws.preload(["a", "b"]) == []  # nothing to read ahead: a statistic reads on its own
    shown = ["l2", "max", "min"]
    for stat in shown:
        expected = open_run(new).statistic(stat).to_numpy()
        np.testing.assert_array_equal(ws.stat_values("a", stat).to_numpy(), expected)
        ws.relative_difference("a", "b", stat)
    kept = {stat for (name, stat) in ws.holding.keys("statistics") if name == "a"}
    assert kept == set(shown[-KEPT_STATISTICS:])
    assert ws.derived_bytes() == KEPT_STATISTICS * STEPS * SITES * 8  # the relative differences of those alone
    assert ws.relative_difference("a", "b", "l2").sel(step=19).max() == 0  # read again: equal before step 20
    older = Workspace.open(old.parent)
    assert older.preload(["a"]) == ["a"]  # a v2 store still reads every statistic in one pass


@pytest.mark.parametrize("diverge_at", [None, (0, 0), (63, 39), (130, 7), (299, 3)])
def test_the_first_divergence_read_block_by_block_is_the_one_compare_finds(
        tmp_path: Path, diverge_at: tuple[int, int] | None) -> None:
    a = write_synthetic_run(tmp_path / "a", steps=300, sites=40, seed=1)
    b = write_synthetic_run(tmp_path / "b", steps=300, sites=40, seed=1, diverge_at=diverge_at)
    found = block_frontier(open_run(a), open_run(b))
    expected = compare(open_run(a).records(), open_run(b).records())
    assert found is not None and found.steps_compared == 300
    assert (found.first_step, found.first_site) == (expected.first_step, expected.first_site)
    assert found.frontier.to_dict() == expected.frontier.to_dict()
    assert found.blocks_read <= 2  # the block where every site first differs, and the last, partial one


@pytest.mark.parametrize(("steps_b", "diverge_at"), [(300, None), (300, (0, 0)), (300, (63, 39)), (230, (130, 7)),
                                                    (300, (299, 3))])
def test_a_comparison_from_the_folds_is_the_one_compare_makes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps_b: int, diverge_at: tuple[int, int] | None) -> None:
    a = write_synthetic_run(tmp_path / "a", steps=300, sites=40, seed=1)
    b = write_synthetic_run(tmp_path / "b", steps=steps_b, sites=40, seed=1, diverge_at=diverge_at)
    expected = compare(open_run(a).records(), open_run(b).records())
    read: list[int] = []
    rows = Run.fingerprint_rows
    monkeypatch.setattr(Run, "fingerprint_rows",
                        lambda self, start, stop: (read.append(stop - start), rows(self, start, stop))[1])
    got = compare_runs(open_run(a), open_run(b))
    assert got is not None and max(read, default=0) <= 64  # no fingerprints read whole
    for field in ("a", "b", "common_steps", "common_sites", "only_in_a", "only_in_b", "first_step", "first_site",
                  "origin_sites", "warnings"):
        assert getattr(got, field) == getattr(expected, field), field
    pd.testing.assert_series_equal(got.frontier, expected.frontier)
    assert got.only_in_a["steps"] == list(range(steps_b, 300))
    xr.testing.assert_identical(got.relative_difference.load(), expected.relative_difference.load())
    pd.testing.assert_frame_equal(got.equal, expected.equal)  # read whole now, when asked for
    assert max(read) == steps_b
    old = write_synthetic_run(tmp_path / "old", steps=300, sites=40, seed=1, schema_version=2)
    assert compare_runs(open_run(a), open_run(old)) is None  # no folds: compare the records


@pytest.mark.parametrize("diverge_at", [None, (3, 2)])
def test_a_run_that_has_not_written_a_whole_block_compares_from_the_folds_too(
        tmp_path: Path, diverge_at: tuple[int, int] | None) -> None:
    # no fold of either run covers the 5 rows both wrote (the fold of a block is written when its 64 rows are)
    a = write_synthetic_run(tmp_path / "a", steps=300, sites=40, seed=1)
    b = write_synthetic_run(tmp_path / "b", steps=300, sites=40, seed=1, diverge_at=diverge_at, written=5,
                            status="running")
    expected = compare(open_run(a).records(), open_run(b).records())
    got = compare_runs(open_run(a), open_run(b))
    assert got is not None and got.common_steps == expected.common_steps == list(range(5))
    assert (got.first_step, got.first_site, got.origin_sites) == (expected.first_step, expected.first_site,
                                                                  expected.origin_sites)
    pd.testing.assert_series_equal(got.frontier, expected.frontier)


def test_a_fold_that_disagrees_with_its_rows_is_damage(tmp_path: Path) -> None:
    a = write_synthetic_run(tmp_path / "a", steps=300, sites=40, seed=1)
    b = write_synthetic_run(tmp_path / "b", steps=300, sites=40, seed=1)
    folds = zarr.open_array(layout.RunPaths(b).store / "sites" / layout.BIN_FINGERPRINT_ARRAY, mode="r+")
    folds[2, 5] = folds[2, 5] + np.uint64(1)  # a fold that says the rows differ where they do not
    with pytest.raises(DamagedStoreError, match="the fold of block 2 disagrees with the fingerprints of its rows "
                                                "128-191"):
        block_frontier(open_run(a), open_run(b))
    counts = zarr.open_array(layout.RunPaths(b).store / "sites" / layout.BIN_ROWS_ARRAY, mode="r+")
    counts[1] = 10
    with pytest.raises(DamagedStoreError, match="block 1 folds 10 of its 64 written rows"):
        block_frontier(open_run(a), open_run(b))
    old = write_synthetic_run(tmp_path / "old", steps=300, sites=40, seed=1, schema_version=2)
    assert block_frontier(open_run(a), open_run(old)) is None  # no folds: analysis.compare reads it whole


def test_a_store_read_through_fsspec_reads_as_the_local_one(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    a = write_synthetic_run(tmp_path / "a", steps=200, sites=40, seed=5)
    b = write_synthetic_run(tmp_path / "b", steps=200, sites=40, seed=5, diverge_at=(90, 4))
    memory, prefix = fsspec.filesystem("memory"), f"/{tmp_path.name}"
    for run_dir in (a, b):
        memory.put(str(run_dir), f"{prefix}/{run_dir.name}", recursive=True)
    remote_a, remote_b = open_run(f"memory:/{prefix}/a"), open_run(f"memory:/{prefix}/b/run.zarr")
    assert remote_a.url == f"memory:/{prefix}/a/run.zarr" and remote_a.status == "complete"
    assert remote_a.fingerprints().equals(open_run(a).fingerprints())
    np.testing.assert_array_equal(remote_a.records().stats.load(), open_run(a).records().stats.load())
    assert remote_a.scalars.equals(open_run(a).scalars) and remote_a.snapshots() == {}
    assert compare(remote_a.records(), remote_b.records()).first_step == 90
    found = block_frontier(remote_a, remote_b)
    assert found is not None and found.first_step == 90
    memory.rm(f"{prefix}/b/run.zarr/sites/fingerprint/c/1/0")
    with pytest.raises(DamagedStoreError, match=f"memory:/{prefix}/b/run.zarr/sites/fingerprint: the chunk of rows "
                                                "64-127 is missing"):
        open_run(f"memory:/{prefix}/b").fingerprints()
    with pytest.raises(RunNotFoundError, match="no run store there"):
        open_run(f"memory:/{prefix}/elsewhere")
    with pytest.raises(ArgumentError, match="a store read through fsspec is upgraded where it lies as a folder"):
        upgrade_plan(remote_a)


def test_a_store_that_fails_while_it_is_built_leaves_no_staging_folder(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.store import writer

    made: list[str] = []
    real = writer._array

    def full_disk(group, name, **spec):  # type: ignore[no-untyped-def]
        made.append(name)
        if len(made) == 3:
            raise OSError(28, "No space left on device")
        return real(group, name, **spec)

    monkeypatch.setattr(writer, "_array", full_disk)
    with pytest.raises(OSError, match="No space left"):
        create_store(tmp_path / "run", {"run_id": "r", "name": "r", "producer": "test"}, 64)
    assert list((tmp_path / "run").iterdir()) == []  # neither a store nor a .run.zarr.creating-PID folder


def test_a_store_is_a_closed_world(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.cli import main
    from workbench.errors import UntrustedFileError

    a = write_synthetic_run(tmp_path / "a", steps=STEPS, sites=SITES, seed=4)
    b = write_synthetic_run(tmp_path / "b", steps=STEPS, sites=SITES, seed=5)
    chunk = Path("sites") / "fingerprint" / "c" / "0" / "0"
    mine = layout.RunPaths(a).store / chunk
    mine.unlink()
    mine.symlink_to(layout.RunPaths(b).store / chunk)  # a valid chunk, of another store
    with pytest.raises(UntrustedFileError, match=f"{mine}: a link to .*outside the run store"):
        open_run(a)
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "outside the run store" in err
    mine.unlink()
    copy = layout.RunPaths(a).store / "fingerprint-copy"
    copy.write_bytes((layout.RunPaths(b).store / chunk).read_bytes())
    mine.symlink_to(copy)  # a link that stays inside the store is read
    assert open_run(a).fingerprints().shape == (STEPS, SITES)
    linked = tmp_path / "elsewhere"
    linked.symlink_to(b, target_is_directory=True)  # the run folder itself reached through a link
    assert open_run(linked).name == "b"

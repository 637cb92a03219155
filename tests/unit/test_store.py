from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from workbench.errors import DamagedStoreError, NotARunError, RunNotFoundError, SchemaVersionError
from workbench.store import layout
from workbench.store.reader import list_runs, open_run
from workbench.store.synthetic import synthetic_loss, write_synthetic_run
from workbench.store.writer import update_manifest


def test_round_trip_of_scalars(synthetic_run: Path) -> None:
    run = open_run(synthetic_run)
    assert run.status == "complete"
    assert run.steps_completed == run.steps_planned == 12
    np.testing.assert_array_equal(run.scalars.loss.to_numpy(), synthetic_loss(12))
    assert run.scalars.index.name == "step"
    assert run.final_loss == synthetic_loss(12)[-1]
    assert run.config.name == "synthetic"


def test_xarray_opens_the_store_with_labelled_steps_and_no_custom_code(synthetic_run: Path) -> None:
    ds = xr.open_zarr(synthetic_run / layout.STORE_DIR, group=layout.SCALARS_GROUP, consolidated=False)
    assert ds["loss"].dims == ("step",)
    np.testing.assert_array_equal(ds["step"].to_numpy(), np.arange(12))
    assert open_run(synthetic_run).dataset()["loss"].sizes["step"] == 12


def test_open_run_accepts_the_zarr_path_too(synthetic_run: Path) -> None:
    assert open_run(synthetic_run / layout.STORE_DIR).path == synthetic_run


def test_partly_written_run_reads_only_written_steps(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "r", steps=20, written=9, status=None)
    run = open_run(run_dir)
    assert run.steps_completed == 9
    assert len(run.scalars) == 9
    assert run.dataset()["loss"].sizes["step"] == 9
    assert not np.isnan(run.scalars.loss).any()


def test_running_store_of_a_dead_launcher_reads_interrupted(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "r", status="running")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    update_manifest(run_dir, launcher={"pid": dead.pid, "host": open_run(run_dir).attrs["host"]})
    assert open_run(run_dir).status == "interrupted"


def test_a_run_written_on_another_host_is_judged_by_its_heartbeat(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "r", status="running")
    elsewhere = {"pid": 1, "host": "another-host"}
    update_manifest(run_dir, launcher=elsewhere)
    assert open_run(run_dir).status == "running"  # no heartbeat: nothing to judge by, the stored status stands
    update_manifest(run_dir, heartbeat={"at": time.time(), "every_s": 30.0})
    assert open_run(run_dir).status == "running"
    update_manifest(run_dir, heartbeat={"at": time.time() - layout.heartbeat_grace(30.0) - 5, "every_s": 30.0})
    assert open_run(run_dir).status == "interrupted"
    update_manifest(run_dir, status="complete")
    assert open_run(run_dir).status == "complete"  # a finished run is never judged


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(RunNotFoundError, match="no such run"):
        open_run(tmp_path / "nope")


def test_folder_without_a_store(tmp_path: Path) -> None:
    with pytest.raises(NotARunError, match="not a run store"):
        open_run(tmp_path)


def test_zarr_group_that_is_not_a_run(tmp_path: Path) -> None:
    zarr.open_group(tmp_path / "x" / layout.STORE_DIR, mode="w", zarr_format=3).attrs["kind"] = "something"
    with pytest.raises(NotARunError, match="not a workbench run"):
        open_run(tmp_path / "x")


def test_newer_schema_is_refused(synthetic_run: Path) -> None:
    update_manifest(synthetic_run, schema_version=layout.SCHEMA_VERSION + 1)
    with pytest.raises(SchemaVersionError, match="upgrade"):
        open_run(synthetic_run)


def test_derived_runs_live_in_their_parent_and_are_listed_under_it(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.cli import main
    from workbench.store.reader import derived_runs, find_runs
    from workbench.studies.workspace import Workspace

    a, b = write_synthetic_run(tmp_path / "a", name="a"), write_synthetic_run(tmp_path / "b", name="b")
    replay = write_synthetic_run(tmp_path / "a" / "replays" / "step_000003", name="a-replay-3")
    bisected = write_synthetic_run(tmp_path / "a" / "bisect" / "a-vs-b" / "b", name="b-replay-3")
    assert find_runs(tmp_path) == [a, b] and list(list_runs(tmp_path)["name"]) == ["a", "b"]
    assert find_runs(tmp_path, derived=True) == [a, bisected, replay, b]
    assert derived_runs(a) == [bisected, replay] and derived_runs(b) == []
    assert sorted(Workspace.open(tmp_path).runs) == ["a", "b"]  # the widgets and notebooks see what ls lists
    assert main(["ls", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    rows = [line.split()[:3] for line in lines]
    assert [row[:3] if row[0] == "└" else row[:1] for row in rows] == [
        ["a"], ["└", "b-replay-3", "(bisect/a-vs-b/b)"], ["└", "a-replay-3", "(replays/step_000003)"], ["b"]]
    # names left-aligned: a run at the line's start, a derived one indented under it
    assert [len(line) - len(line.lstrip()) for line in lines] == [0, 2, 2, 0]


def test_list_runs(tmp_path: Path) -> None:
    write_synthetic_run(tmp_path / "study" / "a", name="a")
    write_synthetic_run(tmp_path / "study" / "b", name="b", written=3, status=None)
    (tmp_path / "study" / "junk").mkdir()
    table = list_runs(tmp_path)
    assert list(table["name"]) == ["a", "b"]
    assert list(table["steps"]) == ["12/12", "3/12"]
    with pytest.raises(RunNotFoundError):
        list_runs(tmp_path / "absent")


def test_manifest_records_determinism_and_versions(synthetic_run: Path) -> None:
    manifest = open_run(synthetic_run).attrs
    assert manifest["schema_version"] == layout.SCHEMA_VERSION
    assert manifest["determinism"]["deterministic"] is True
    assert manifest["determinism"]["required_env"]["NCCL_ALGO"] == "Ring"
    assert manifest["versions"]["zarr"] == zarr.__version__
    assert "config_hash" in manifest and manifest["config"]["name"] == "synthetic"


def test_a_store_being_created_is_never_seen_half_made(tmp_path: Path) -> None:
    """A producer creates stores (the scalars, then the site arrays) while a reader polls each one:
    the reader sees no store or a whole one, never a group without its arrays (the race a busy
    machine exposed)."""
    import threading
    import time

    from workbench.errors import DamagedStoreError
    from workbench.store.synthetic import write_synthetic_run as write_with_sites

    count = 15  # every producer is also read while it writes by the run-store contract (test_run_store_contract)
    producer = threading.Thread(target=lambda: [write_with_sites(tmp_path / f"run{i}", steps=4, sites=6, seed=i)
                                                for i in range(count)])
    producer.start()
    seen = {"scalars": 0, "sites": 0}
    whole: set[Path] = set()  # seen with its sites: read no more, so the reader keeps up with the producer
    try:
        while producer.is_alive():
            for run_dir in sorted(tmp_path.glob("run*")):
                if run_dir in whole or not (run_dir / layout.STORE_DIR).exists():
                    continue
                try:
                    run = open_run(run_dir)
                    assert run.steps_planned == 4 and len(run.scalars.columns) > 0
                    seen["scalars"] += 1
                    if run.has_sites:
                        assert run.fingerprints().shape[1] == 6
                        seen["sites"] += 1
                        whole.add(run_dir)
                except DamagedStoreError as err:
                    pytest.fail(f"a reader saw a half-made store: {err}")
            time.sleep(0.001)  # each pass lets the producer's thread have the interpreter
    finally:
        producer.join()
    assert seen["scalars"] > 0 and seen["sites"] > 0
    for i in range(count):
        assert open_run(tmp_path / f"run{i}").fingerprints().shape == (4, 6)
    assert not [p for p in tmp_path.rglob(".*")]  # no staging folder left behind


def _first_chunk(array_dir: Path) -> Path:
    return next(p for p in sorted((array_dir / "c").rglob("*")) if p.is_file())


def test_every_chunk_of_a_written_row_is_on_disk_even_when_it_holds_only_fill_values(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "run")
    store = layout.RunPaths(run_dir).store
    assert np.isnan(open_run(run_dir).scalars.val_loss).all()  # the fill value, NaN, in every written row
    assert open_run(run_dir).every_chunk_written
    _first_chunk(store / "scalars" / "val_loss").unlink()
    with pytest.raises(DamagedStoreError, match=r"scalars/val_loss: the chunk of rows 0-11 is missing"):
        _ = open_run(run_dir).scalars


def test_an_older_store_is_checked_where_a_missing_chunk_cannot_be_fill_values(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "run", steps=8, sites=12, seed=1)
    store = layout.RunPaths(run_dir).store
    update_manifest(run_dir, **{layout.EVERY_CHUNK_WRITTEN: None})  # as stores written before the flag
    _first_chunk(store / "scalars" / "val_loss").unlink()  # such a store left all-NaN chunks out
    assert np.isnan(open_run(run_dir).scalars.val_loss).all()
    _first_chunk(store / "sites" / "stats").unlink()  # a recorded row is never all fill values
    with pytest.raises(DamagedStoreError, match=r"sites/stats: the chunk of rows .* is missing"):
        open_run(run_dir).records()


@pytest.mark.parametrize("removed", ["sites/name/c/0", "sites/kind/c/0", "sites/site/c/0", "sites/step/c/0",
                                     "scalars/done/c/0", "sites/done/c/0", "scalars/val_loss/zarr.json"])
def test_a_file_a_finished_store_wrote_is_missed_not_read_as_fill_values(tmp_path: Path, removed: str) -> None:
    """Zarr reads a missing chunk as fill values: a site named "", no step done, a validation loss of NaN. In a
    store that writes every chunk, a coordinate written whole, a finished run's done flags and a scalar of its
    schema are there, so a missing one is damage, named."""
    run_dir = write_synthetic_run(tmp_path / "run", steps=20, sites=12)
    (run_dir / layout.STORE_DIR / removed).unlink()
    with pytest.raises(DamagedStoreError, match=removed.rsplit("/", 2)[0] if "c/" in removed else "val_loss"):
        run = open_run(run_dir)
        run.scalars, run.site_table(), run.fingerprints()

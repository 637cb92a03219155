"""The run store's contract: the tests every producer's store must pass, in the manner of zarr's
``zarr.testing.store.StoreTests``. The runner, ``record()``, each importer and the synthetic writer are held to
it (``tests/unit/test_run_store_contract.py``, ``tests/integration/test_run_store_contract.py``); a new
producer subclasses it and gives the fixture ``produced``:

    class TestMyImporter(RunStoreContract):
        @pytest.fixture(scope="class")
        def produced(self, tmp_path_factory):
            out = tmp_path_factory.mktemp("mine") / "run"
            return produce_watched(lambda: my_import(SOURCE, out), out)

``produce_watched`` runs the producer while this thread reads the folder over and over, as ``workbench ls`` or
a notebook does while a run trains, and keeps what each read saw. The contract then asks of the finished
store, and of every read made while it was written:

* it opens with plain xarray (``xarray.open_zarr`` of its groups), labelled as the reader labels it;
* its manifest parses, with a run id, a name and a producer, and the run is complete;
* its sites are canonical (``workbench.sites``) and in execution order;
* its fingerprints merge: each block's fold is the fold of its rows, and the store compared with itself
  finds every site equal at every step, by the folds and by the rows;
* a read while it was being written saw a consistent prefix: nothing, or written steps from the first on whose
  values are the finished store's;
* damage is reported (``workbench.testing.damage``): a file of it cut, its bytes flipped, or removed, reads
  as before or fails with a workbench error that names the store, never another exception or other values.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

from workbench.analysis.compare import compare
from workbench.errors import NotARunError, NotRecordedYetError, RunNotFoundError, WorkbenchError
from workbench.sites import KINDS, SITE_KINDS, site_id, strip_wrappers
from workbench.statistics import STAT_NAMES, fold_fingerprints
from workbench.store import layout
from workbench.store.reader import Run, open_run
from workbench.studies.comparing import compare_runs
from workbench.testing.damage import damage_bytes

NOT_YET = (RunNotFoundError, NotRecordedYetError)
"""What a reader may meet while a store is being made: no store yet, or no recorded step yet."""


@dataclass
class Seen:
    """What one read of a store being written saw: the written steps' scalars and recorded rows (None: no
    store, or none of that yet), or the error it met."""

    loss: dict[int, float] | None = None
    fingerprints: dict[int, np.ndarray] | None = None
    error: str | None = None


@dataclass
class Produced:
    """A producer's finished run folder and the reads made while it was written."""

    run_dir: Path
    seen: list[Seen] = field(default_factory=list)


def produce_watched(produce: Callable[[], object], run_dir: Path, *, pause_s: float = 0.02) -> Produced:
    """Run ``produce()`` (which writes the run folder ``run_dir``) in a thread while this one reads ``run_dir``
    until it returns, ``pause_s`` apart (a producer in this process shares its interpreter with the reads); its
    exception, if any, is raised here."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            produce()
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            failure.append(error)

    writer = threading.Thread(target=run, name="producer")
    writer.start()
    produced = Produced(run_dir)
    while writer.is_alive():
        produced.seen.append(read_while_written(run_dir))
        time.sleep(pause_s)
    writer.join()
    if failure:
        raise failure[0]
    return produced


def read_while_written(run_dir: Path) -> Seen:
    """One read of a store that may be being written, as a reader of it makes one."""
    try:
        run = open_run(run_dir)
        loss = {int(step): float(value) for step, value in run.scalars["loss"].items()}
        if not run.has_sites:
            return Seen(loss=loss)
        try:
            prints = run.fingerprints()
        except NotRecordedYetError:
            return Seen(loss=loss)
        return Seen(loss=loss, fingerprints={int(step): row for step, row in zip(prints.index, prints.to_numpy())})
    except NOT_YET:
        return Seen()
    except NotARunError as error:  # a folder being made holds no store yet (its writer's lock only)
        return Seen() if type(error) is NotARunError else Seen(error=f"{type(error).__name__}: {error}")
    except Exception as error:  # noqa: BLE001 - any other is the finding
        return Seen(error=f"{type(error).__name__}: {error}")


def read_everything(run_dir: Path) -> list[Any]:
    """Everything the reader gives of a store, as plain values: manifest, scalars, sites, fingerprints, every
    statistic, the folds."""
    run = open_run(run_dir)
    found: list[Any] = [run.manifest, run.status, run.scalars.to_numpy(), run.dataset().compute().to_dict()]
    if run.has_sites:
        table = run.site_table()
        found += [table.to_numpy().tolist(), list(table.index), run.recorded_step_numbers(),
                  run.fingerprints().to_numpy()]
        found += [run.statistic(name).to_numpy() for name in STAT_NAMES]
        if run.has_bin_fingerprints:
            found += list(run.bin_fingerprints(run.recorded_steps_completed))
    return found


def _same(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and x.dtype.kind in "fiub":
            if not (x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind == "f")):
                return False
        elif repr(_plain(x)) != repr(_plain(y)):  # as text: NaN equals NaN
            return False
    return True


def _plain(value: Any) -> Any:
    """``value`` with its mappings in key order (xarray lists a store's variables in the order the filesystem
    does) and its arrays as lists."""
    if isinstance(value, dict):
        return sorted((str(key), _plain(item)) for key, item in value.items())
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value.tolist() if isinstance(value, np.ndarray) else value


class RunStoreContract:
    """The contract's tests (see the module docstring); a subclass gives ``produced``."""

    damaged_files = 8
    """How many of the store's files the damage test damages (spread over its sorted files)."""

    @pytest.fixture(scope="class")
    def produced(self, tmp_path_factory: pytest.TempPathFactory) -> Produced:
        raise NotImplementedError("a producer's test class gives the fixture `produced`")

    @pytest.fixture(scope="class")
    def run(self, produced: Produced) -> Run:
        return open_run(produced.run_dir)

    def test_it_opens_with_plain_xarray(self, produced: Produced, run: Run) -> None:
        store = produced.run_dir / layout.STORE_DIR
        scalars = xr.open_zarr(store, group=layout.SCALARS_GROUP, consolidated=False)
        assert "loss" in scalars and scalars["loss"].dims == (layout.STEP_DIM,)
        written = scalars["loss"].sel({layout.STEP_DIM: run.scalars.index.to_numpy()}).to_numpy()
        assert np.array_equal(written, run.scalars["loss"].to_numpy(), equal_nan=True)
        if run.has_sites:
            sites = xr.open_zarr(store, group=layout.SITES_GROUP, consolidated=False)
            assert sites[layout.STATS_ARRAY].dims == (layout.STEP_DIM, layout.SITE_DIM, layout.STAT_DIM)
            assert sites[layout.FINGERPRINT_ARRAY].dims == (layout.STEP_DIM, layout.SITE_DIM)
            assert [str(s) for s in sites[layout.SITE_DIM].to_numpy()] == run.site_names()
            assert [str(s) for s in sites[layout.STAT_DIM].to_numpy()] == list(STAT_NAMES)
            rows = run.recorded_steps_completed
            assert np.array_equal(sites[layout.FINGERPRINT_ARRAY][:rows].to_numpy(), run.fingerprints().to_numpy())

    def test_its_manifest_parses(self, run: Run) -> None:
        manifest = run.manifest
        assert manifest.run_id and manifest.name and manifest.producer
        assert run.status == layout.Status.COMPLETE
        assert run.steps_completed > run.first_step or run.steps_planned == 0

    def test_its_sites_are_canonical_and_in_execution_order(self, run: Run) -> None:
        if not run.has_sites:
            pytest.skip("scalars only: no sites")
        table = run.site_table()
        assert table.index.is_unique
        for site, row in table.iterrows():
            assert row["kind"] in KINDS, site
            assert site == site_id(row["kind"], row["name"]), site
            name = str(row["name"])
            assert strip_wrappers(name) == name and not name.startswith("decoder.") \
                and ".local_experts." not in name, f"{site}: not a canonical name"
        assert list(table["order"]) == sorted(table["order"]) and table["order"].is_unique
        phases = [SITE_KINDS.index(kind) for kind in table["kind"]]
        assert phases == sorted(phases), "sites of one kind come after a kind that happens later in a step"

    def test_its_fingerprints_merge(self, run: Run) -> None:
        if not run.has_sites:
            pytest.skip("scalars only: no fingerprints")
        rows = run.recorded_steps_completed
        prints = run.fingerprints().to_numpy()
        if run.has_bin_fingerprints:
            size, folds = run.bin_fingerprints(rows)
            for block in range(len(folds)):
                numbers = np.arange(block * size, (block + 1) * size)
                assert np.array_equal(folds[block], fold_fingerprints(prints[numbers], numbers)), block
        for result in (compare(run.records(), run.records()), compare_runs(run, run)):
            if result is None:  # no folds: the rows' comparison stands alone
                continue
            assert result.first_step is None and result.first_site is None
            assert list(result.common_sites) == run.site_names() and len(result.common_steps) == rows

    def test_a_read_while_it_was_written_saw_a_consistent_prefix(self, produced: Produced, run: Run) -> None:
        final_loss = run.scalars["loss"]
        final_prints = run.fingerprints() if run.has_sites else None
        assert produced.seen, "no read was made while it was written"
        for i, seen in enumerate(produced.seen):
            assert seen.error is None, f"read {i} of {len(produced.seen)}: {seen.error}"
            if seen.loss is None:
                continue
            steps = sorted(seen.loss)
            assert steps == list(range(steps[0], steps[0] + len(steps))) if steps else True, f"read {i}: a gap"
            for step in steps:
                assert np.array_equal(seen.loss[step], final_loss[step], equal_nan=True), f"read {i}, step {step}"
            for step, row in (seen.fingerprints or {}).items():
                assert final_prints is not None and np.array_equal(row, final_prints.loc[step].to_numpy()), \
                    f"read {i}: step {step}'s fingerprints differ from the finished store's"

    def test_damage_is_reported(self, produced: Produced, tmp_path: Path) -> None:
        pristine = read_everything(produced.run_dir)
        files = sorted(p for p in (produced.run_dir / layout.STORE_DIR).rglob("*") if p.is_file())
        picked = [files[i * len(files) // min(self.damaged_files, len(files))]
                  for i in range(min(self.damaged_files, len(files)))]
        failures = []
        for number, path in enumerate(picked):
            relative = path.relative_to(produced.run_dir)
            for action in ("truncate", "flip", "remove"):
                case = tmp_path / f"{number}-{action}" / produced.run_dir.name
                shutil.copytree(produced.run_dir, case, ignore=shutil.ignore_patterns("checkpoints", "logs"))
                if action == "remove":
                    (case / relative).unlink()
                else:
                    damage_bytes(case / relative, {"action": action, "keep": 0.5, "at": [0.5]})
                try:
                    found = read_everything(case)
                except WorkbenchError as error:
                    if str(case) not in str(error) or "\n" in str(error).strip():
                        failures.append(f"{relative} {action}: {type(error).__name__} not naming it in one line: "
                                        f"{error}")
                except Exception as error:  # noqa: BLE001 - the finding
                    failures.append(f"{relative} {action}: {type(error).__name__}: {error}")
                else:
                    if not _same(found, pristine):
                        failures.append(f"{relative} {action}: read without complaint, and not as it was")
                shutil.rmtree(case.parent)
        assert not failures, "\n".join(failures)

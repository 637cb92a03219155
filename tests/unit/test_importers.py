"""Importers: TE debug logs and TensorBoard files round-trip to the same first divergence as the stores."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from workbench.analysis import RunRecords, compare
from workbench.analysis.anomalies import find_anomalies
from workbench.cli import main
from workbench.errors import UnsupportedError, WorkbenchError
from workbench.importers import (
    ImportFormatError,
    LogNotFoundError,
    import_te_log,
    read_te_log,
    read_tensorboard,
    records_from_table,
    statistic_fingerprints,
    te_log_path,
    write_te_log,
    write_tensorboard,
)
from workbench.importers.te_log import DEFAULT_STATS, site_of, te_names
from workbench.statistics import STAT_NAMES
from workbench.store.reader import list_runs, open_run
from workbench.store.synthetic import synthetic_sites, write_synthetic_run

STEPS, SITES, DIVERGE_AT = 30, 130, (17, 41)  # 130 sites: more than an int8 categorical code holds


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stores")
    return {"a": write_synthetic_run(root / "a", steps=STEPS, sites=SITES, seed=0),
            "b": write_synthetic_run(root / "b", steps=STEPS, sites=SITES, seed=0, diverge_at=DIVERGE_AT)}


def test_te_log_import_finds_the_stores_first_divergence(stores: dict[str, Path], tmp_path: Path) -> None:
    expected = compare(open_run(stores["a"]).records(), open_run(stores["b"]).records())
    imported = {}
    for name, store in stores.items():
        log = write_te_log(te_log_path(tmp_path / "logs" / name), open_run(store).records())
        imported[name] = import_te_log([log.parent], tmp_path / "runs" / f"te-{name}")
    a, b = open_run(imported["a"]).records(lazy=False), open_run(imported["b"]).records(lazy=False)
    result = compare(a, b)
    assert (result.first_step, result.first_site) == (expected.first_step, expected.first_site) == (
        DIVERGE_AT[0], synthetic_sites(SITES)[DIVERGE_AT[1]].site)
    original = open_run(stores["a"]).records(lazy=False)
    assert a.sites == original.sites and a.steps == original.steps
    logged = list(DEFAULT_STATS)
    np.testing.assert_array_equal(a.stats.sel(stat=logged).to_numpy(), original.stats.sel(stat=logged).to_numpy())
    assert np.isnan(a.stats.sel(stat=[s for s in STAT_NAMES if s not in logged]).to_numpy()).all()


def test_an_imported_run_reads_as_a_complete_run(stores: dict[str, Path], tmp_path: Path) -> None:
    log = write_te_log(tmp_path / "a.log", open_run(stores["a"]).records(), stats=("count", "l2"))
    run = open_run(import_te_log(log, tmp_path / "runs" / "imported", name="te-a"))
    assert run.name == "te-a" and run.status == "complete" and run.steps_completed == STEPS
    assert run.scalars["loss"].isna().all()
    assert run.attrs["imported"]["format"] == "transformer_engine_debug_log"
    assert run.attrs["imported"]["files"] == [str(log.resolve())]
    assert "not of the tensor" in run.attrs["imported"]["fingerprint"]
    assert int(run.site_table()["numel"].iloc[0]) == 65536  # from the logged count
    assert list_runs(tmp_path / "runs")["steps"].tolist() == [f"{STEPS}/{STEPS}"]


def test_an_import_without_scalars_has_no_nan_loss_anomaly(stores: dict[str, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # TE's debug log holds tensor statistics, no loss: the store's NaN scalars say nothing was logged
    example = Path(__file__).parents[2] / "data" / "examples" / "te_debug"
    run = open_run(import_te_log([example], tmp_path / "runs" / "te-a"))
    assert run.scalars["loss"].isna().all() and run.logs_scalars is False
    assert main(["anomalies", str(run.path)]) == 0
    assert "no anomalies" in capsys.readouterr().out
    assert find_anomalies(run.scalars, run.records(), scalars_logged=run.logs_scalars).empty
    flagged = find_anomalies(run.scalars, None)  # the same NaN, had the producer logged it: the training's own
    assert flagged["rule"].tolist() == ["nonfinite"] and flagged["site"].tolist() == ["scalar:loss"]
    assert open_run(stores["a"]).logs_scalars  # a store the runner wrote logs its scalars


def test_identical_runs_import_identical(stores: dict[str, Path], tmp_path: Path) -> None:
    records = open_run(stores["a"]).records()
    one = records_from_table(read_te_log(write_te_log(tmp_path / "1.log", records)), "one")
    two = records_from_table(read_te_log(write_te_log(tmp_path / "2.log", records)), "two")
    assert compare(one, two).identical


@pytest.mark.parametrize("site", [info.site for info in synthetic_sites(50)] + [
    "loss:cross_entropy", "grad_local:layers.0.mlp.linear_fc1.weight", "param:output_layer.weight",
    "act:embedding", "activation:layers.0.mlp.linear_fc1", "dgrad:layers.0.mlp.linear_fc1",
    "exp_avg_sq:layers.2.mlp.linear_fc2.bias"])
def test_sites_map_to_te_names_and_back(site: str) -> None:
    assert site_of(*te_names(site)) == site


def test_te_names_of_megatron_layers() -> None:
    assert te_names("param:layers.3.mlp.linear_fc1.weight") == ("layers.3.mlp.linear_fc1", "weight")
    assert te_names("grad:layers.3.mlp.linear_fc1.weight") == ("layers.3.mlp.linear_fc1", "wgrad")
    assert te_names("act:layers.3.mlp") == ("layers.3.mlp", "output")
    assert site_of("module.decoder.layers.3.mlp.linear_fc1", "weight") == "param:layers.3.mlp.linear_fc1.weight"


_INFO, _TAB, _FC1 = "2025-03-01 12:00:00,002 - INFO - ", " \t\t\t\t ", "decoder.layers.1.mlp.linear_fc1"
JUNK_AND_VALUES = "".join([
    f"{_INFO}Default logging to file enabled at /logs\n",
    f"{_INFO}{_FC1}_activation_max{_TAB}iteration=000005{_TAB}value=1.5\n",
    "2025-03-01 12:00:00,003 - WARNING - something - with dashes iteration= broken\n",
    f"{_FC1}_activation_min{_TAB}iteration=000005{_TAB}value=nan\r\n",  # no logging prefix, CRLF
    f"{_INFO}{_FC1}_wgrad_l2_norm{_TAB}iteration=000005{_TAB}value=inf\n",
    f"{_INFO}{_FC1}_gradient_std{_TAB}iteration=000005{_TAB}value=-2.5e-05\n",
    f"{_INFO}optimizer_exp_avg_num_zeros{_TAB}iteration=000005{_TAB}value=3.0000\n",  # another feature's metric
    f"{_INFO}{_FC1}_activation_max{_TAB}iteration=000005{_TAB}value=oops\n",
    f"{_INFO}{_FC1}_activation_max{_TAB}iteration=000006{_TAB}value=-inf\n",
])


def test_junk_lines_are_skipped_and_nan_and_inf_read(tmp_path: Path) -> None:
    path = tmp_path / "rank0.log"
    path.write_bytes(JUNK_AND_VALUES.encode())
    table = read_te_log(path)
    rows = [(int(s), str(site), str(stat), float(v)) for s, site, stat, v in table.itertuples(index=False)]
    fc1 = "layers.1.mlp.linear_fc1"
    assert rows[0] == (5, f"activation:{fc1}", "max", 1.5)
    assert rows[1][:3] == (5, f"activation:{fc1}", "min") and np.isnan(rows[1][3])
    assert rows[2:] == [(5, f"grad:{fc1}.weight", "l2", np.inf), (5, f"act_grad:{fc1}", "std", -2.5e-05),
                        (6, f"activation:{fc1}", "max", -np.inf)]
    assert table.attrs["skipped_keys"] == ["optimizer_exp_avg_num_zeros"]


@pytest.mark.parametrize("text", ["", "2025-03-01 12:00:00,001 - INFO - Default logging enabled\n",
                                  "optimizer_exp_avg_num_zeros \t iteration=000005 \t value=3.0\n"])
def test_a_file_without_statistics_is_a_clear_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "nvdlfw_inspect_globalrank-0.log"
    path.write_text(text)
    with pytest.raises(ImportFormatError, match=str(path)) as error:
        read_te_log(path)
    assert isinstance(error.value, WorkbenchError) and "statistic" in str(error.value)


def test_missing_logs_are_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LogNotFoundError, match="no such file"):
        read_te_log(tmp_path / "missing.log")
    with pytest.raises(LogNotFoundError, match="globalrank"):
        read_te_log(tmp_path)


def test_every_rank_of_a_folder_is_read_first_value_kept(stores: dict[str, Path], tmp_path: Path) -> None:
    records = open_run(stores["a"]).records(lazy=False)
    sites = records.sites
    first = RunRecords(name="r0", fingerprints=records.fingerprints[sites[:3]], stats=records.stats.sel(site=sites[:3]))
    second = RunRecords(name="r1", fingerprints=records.fingerprints[sites[2:5]],
                        stats=records.stats.sel(site=sites[2:5]) * 2.0)  # sites[2] logged differently by rank 1
    write_te_log(te_log_path(tmp_path, rank=10), second)
    write_te_log(te_log_path(tmp_path, rank=2), first)
    run = open_run(import_te_log(tmp_path, tmp_path / "run"))
    assert [Path(f).name for f in run.attrs["imported"]["files"]] == [
        "nvdlfw_inspect_globalrank-2.log", "nvdlfw_inspect_globalrank-10.log"]
    imported = run.records(lazy=False)
    assert imported.sites == sites[:5]
    assert run.attrs["imported"]["conflicting_duplicates"] == STEPS * len(DEFAULT_STATS)
    np.testing.assert_array_equal(imported.stats.sel(site=sites[2], stat="l2"), records.stats.sel(site=sites[2],
                                                                                                  stat="l2"))


def _one_site(value: float) -> RunRecords:
    stats = np.full((1, 1, len(STAT_NAMES)), value)
    return RunRecords(name="x", fingerprints=pd.DataFrame([[0]], columns=["act:layers.0"], dtype=np.uint64),
                      stats=xr.DataArray(stats, dims=("step", "site", "stat"),
                                         coords={"step": [0], "site": ["act:layers.0"], "stat": list(STAT_NAMES)}))


def test_four_decimals_hide_what_exact_values_show(tmp_path: Path) -> None:
    def loaded(value: float, decimals: int | None, name: str) -> RunRecords:
        return records_from_table(read_te_log(write_te_log(tmp_path / f"{name}.log", _one_site(value),
                                                           decimals=decimals)), name)

    assert not compare(loaded(1.0, None, "a"), loaded(1.0 + 1e-9, None, "b")).identical
    assert compare(loaded(1.0, 4, "c"), loaded(1.0 + 1e-9, 4, "d")).identical  # what nvdlfw_inspect writes


def test_statistic_fingerprints_see_every_bit_and_ignore_order() -> None:
    values = np.array([[[1.0, 2.0, np.nan]]])
    present = np.array([[[True, True, True]]])
    base = statistic_fingerprints(values, present, ["min", "max", "mean"])
    assert statistic_fingerprints(values[..., ::-1], present, ["mean", "max", "min"]) == base
    assert statistic_fingerprints(values[..., [1, 0, 2]], present, ["min", "max", "mean"]) != base
    assert statistic_fingerprints(np.nextafter(values, 3.0), present, ["min", "max", "mean"]) != base
    assert statistic_fingerprints(values, np.array([[[True, True, False]]]), ["min", "max", "mean"]) != base


def test_tensorboard_round_trip(tmp_path: Path) -> None:
    a = write_synthetic_run(tmp_path / "a", steps=20, sites=10, seed=1)
    b = write_synthetic_run(tmp_path / "b", steps=20, sites=10, seed=1, diverge_at=(7, 4), initial_difference=1e-3)
    expected = compare(open_run(a).records(), open_run(b).records())
    loaded = {}
    for name, store in (("a", a), ("b", b)):
        records = open_run(store).records(lazy=False)
        write_tensorboard(tmp_path / "tb" / name, records)
        loaded[name] = records_from_table(read_tensorboard(tmp_path / "tb" / name), name)
    result = compare(loaded["a"], loaded["b"])
    assert (result.first_step, result.first_site) == (expected.first_step, expected.first_site) == (
        7, synthetic_sites(10)[4].site)
    original = open_run(a).records(lazy=False)
    assert loaded["a"].sites == original.sites and loaded["a"].steps == original.steps
    stats = list(DEFAULT_STATS)
    np.testing.assert_array_equal(loaded["a"].stats.sel(stat=stats).to_numpy(),  # float32 in the file
                                  original.stats.sel(stat=stats).to_numpy().astype(np.float32).astype(np.float64))


def test_tensorboard_folder_without_site_scalars_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ImportFormatError, match="no scalars"):
        read_tensorboard(tmp_path)
    with pytest.raises(LogNotFoundError):
        read_tensorboard(tmp_path / "missing")


def test_tensorboard_missing_is_unsupported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(UnsupportedError, match="pip install tensorboard"):
        read_tensorboard(tmp_path)

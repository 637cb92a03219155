"""The example inputs in data/examples/ load with the commands data/README.md shows, and agree with each other.

They come from one run (data/examples/make_examples.py); these tests need no training, and compare
only values copied from one file into another, never a number that depends on the CPU that trained.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from workbench.analysis.golden_values import GoldenValues, parse_golden_values
from workbench.cli import main as cli
from workbench.config import load_run_config
from workbench.store.golden_file import read_golden_document
from workbench.store.reader import open_run

DATA = Path(__file__).resolve().parents[2] / "data"
EXAMPLES = DATA / "examples"
GOLDEN = EXAMPLES / "golden.json"
MEGATRON_GOLDEN = EXAMPLES / "golden_values_cpu.json"
MEGATRON_TB = EXAMPLES / "megatron_tb"
TE_DEBUG = EXAMPLES / "te_debug"
SCALARS = ("loss", "grad_norm", "lr", "loss_scale")
TE_LAYERS = ("self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2")


@pytest.fixture(scope="module")
def golden() -> GoldenValues:
    return parse_golden_values(read_golden_document(GOLDEN), str(GOLDEN))


@pytest.fixture(scope="module")
def megatron_golden() -> GoldenValues:
    return parse_golden_values(read_golden_document(MEGATRON_GOLDEN), str(MEGATRON_GOLDEN))


def test_the_golden_files_parse_and_cover_the_example_runs_steps(golden: GoldenValues,
                                                                  megatron_golden: GoldenValues) -> None:
    cfg = load_run_config(EXAMPLES / "example.toml")
    assert golden.format == "workbench" and golden.run == cfg.name
    assert list(golden.scalars.index) == list(range(cfg.steps))
    assert golden.weights is not None and list(golden.weights.index) == list(range(cfg.steps))
    assert golden.weights.nunique() == cfg.steps  # the weights change at every step
    assert megatron_golden.format == "megatron" and megatron_golden.unmapped == ()
    assert list(megatron_golden.scalars.index) == list(golden.scalars.index)
    assert set(megatron_golden.scalars.columns) == {*SCALARS, "step_time"}


def test_the_megatron_golden_values_are_the_runs_scalars_through_tensorboard(golden: GoldenValues,
                                                                             megatron_golden: GoldenValues) -> None:
    # as Megatron-LM makes golden values: the float32 TensorBoard keeps, rounded to 5 decimals
    for name in SCALARS:
        expected = [round(float(np.float32(v)), 5) for v in golden.scalars[name]]
        assert megatron_golden.scalars[name].tolist() == expected, name


def test_import_megatron_gives_the_runs_scalars_as_float32(tmp_path: Path, golden: GoldenValues) -> None:
    out = tmp_path / "mlm-example"
    assert cli(["import-megatron", str(MEGATRON_TB), "--out", str(out), "--tokens-per-step", "256"]) == 0
    run = open_run(out)
    assert run.status == "complete" and run.steps_completed == len(golden.scalars) and not run.has_sites
    for name in SCALARS:
        np.testing.assert_array_equal(run.scalars[name].to_numpy(),
                                      golden.scalars[name].to_numpy(np.float32).astype(np.float64), err_msg=name)
    assert list(np.flatnonzero(np.isfinite(run.scalars["val_loss"].to_numpy()))) == [3, 7]  # --eval-interval 4
    assert {"lm loss vs samples", "lm loss validation ppl"} <= set(run.attrs["imported"]["other_tags"])
    assert cli(["check", str(out), "--golden", str(MEGATRON_GOLDEN)]) == 0
    # float32 is not the run's float64, and an import has no weights: bitwise it fails, to 1e-6 it passes
    assert cli(["check", str(out), "--golden", str(GOLDEN)]) == 1
    assert cli(["check", str(out), "--golden", str(GOLDEN), "--rtol", "1e-6"]) == 0


def test_import_te_gives_the_linear_layers_weights_and_weight_gradients(tmp_path: Path, golden: GoldenValues) -> None:
    out = tmp_path / "te-example"
    assert cli(["import-te", str(TE_DEBUG), "--out", str(out)]) == 0
    run = open_run(out)
    assert run.manifest.producer == "import: transformer_engine_debug_log"
    assert run.attrs["imported"]["skipped_metrics"] == []
    records = run.records(lazy=False)
    assert records.steps == list(golden.scalars.index)
    assert sorted(records.sites) == sorted(f"{kind}:layers.{i}.{layer}.weight" for kind in ("param", "grad")
                                           for i in range(2) for layer in TE_LAYERS)
    logged = records.stats.sel(stat=["min", "max", "absmax", "l2"]).to_numpy()  # [step, site, stat]
    assert np.isfinite(logged).all()
    tenths_of_thousandths = logged * 1e4
    assert np.abs(tenths_of_thousandths - np.round(tenths_of_thousandths)).max() < 1e-6  # TE prints 4 decimals
    low, high, absmax, l2 = np.moveaxis(logged, -1, 0)
    np.testing.assert_array_equal(absmax, np.maximum(-low, high))
    assert (l2 >= absmax).all() and (low <= high).all()
    assert np.isnan(records.stats.sel(stat=["sum", "sum_sq"]).to_numpy()).all()  # not in the log


def test_every_shipped_example_is_small_and_described_in_the_data_readme() -> None:
    readme = (DATA / "README.md").read_text()
    files = [p for p in EXAMPLES.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert len(files) >= 6
    for path in files:
        assert path.stat().st_size < 256 * 1024, path
    for entry in EXAMPLES.iterdir():
        if entry.name != "__pycache__":
            assert re.search(rf"`{re.escape(entry.name)}/?`", readme), f"data/README.md does not name {entry.name}"

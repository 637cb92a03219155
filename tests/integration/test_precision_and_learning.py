"""bf16 and fp16 train; the demo's config learns the corpus well below ln(vocab)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from tests.helpers.training import Runs
from workbench.config import load_run_config
from workbench.runner.launch import launch
from workbench.store.reader import open_run

EXAMPLES = Path(__file__).resolve().parents[2] / "workbench" / "examples"


def test_bf16_trains_close_to_fp32_but_not_bitwise(runs: Runs) -> None:
    fp32 = open_run(runs.get("base")).scalars
    bf16 = open_run(runs.get("bf16", precision="bf16")).scalars
    assert np.isfinite(bf16.loss).all()
    assert not np.array_equal(bf16.loss, fp32.loss)
    np.testing.assert_allclose(bf16.loss, fp32.loss, rtol=0.05)


def test_fp16_uses_dynamic_loss_scaling(runs: Runs) -> None:
    run = open_run(runs.get("fp16", precision="fp16"))
    scalars = run.scalars
    assert scalars.loss_scale.iloc[0] == 2.0**16
    assert np.isfinite(scalars.loss).all()
    assert run.attrs["precision"] == "fp16"


def test_demo_config_learns_well_below_uniform(tmp_path: Path) -> None:
    cfg = load_run_config(EXAMPLES / "demo_base.toml").with_overrides({"checkpoint_every": 0})
    run = open_run(launch(cfg, tmp_path / "demo"))
    uniform = math.log(cfg.model.vocab_size)
    assert run.scalars.loss.iloc[0] > 0.9 * uniform  # starts near ln(vocab): nothing leaks
    assert run.final_loss < 0.4 * uniform

"""The cost widget, driven as a user would: the measure, warm-up, interval and configurations change the tax."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr

from workbench.errors import ArgumentError
from workbench.store import layout
from workbench.store.synthetic import write_synthetic_run
from workbench.store.writer import update_manifest
from workbench.studies.workspace import Workspace
from workbench.widgets.cost import CPU_CAVEAT, CostWidget


def _throughput(run_dir: Path, tokens: np.ndarray, *, deterministic: bool) -> None:
    scalars = zarr.open_group(layout.RunPaths(run_dir).store / layout.SCALARS_GROUP, mode="r+")
    scalars["tokens_per_s"][:] = tokens
    scalars["step_time"][:] = 1000.0 / tokens
    update_manifest(run_dir, deterministic=deterministic, runtime={"device": "cpu"})


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cost")
    rng = np.random.default_rng(0)
    for name, deterministic, speed in (("det", True, 900.0), ("default", False, 1000.0)):
        run = write_synthetic_run(root / name, steps=30, sites=4)
        tokens = speed * (1 + 0.01 * rng.standard_normal(30))
        tokens[:3] = 100.0  # a slow warm-up
        _throughput(run, tokens, deterministic=deterministic)
    return root


def test_the_controls_change_the_tax_and_its_interval(folder: Path, tmp_path: Path) -> None:
    widget = CostWidget(folder)
    assert CPU_CAVEAT in widget.caveat.value
    assert len(widget.table) == 1
    tax = widget.table["tax_percent"].iloc[0]
    assert 9 < tax < 13  # 1000 / 900 - 1 = 11 %
    wide = widget.table["ci_high"].iloc[0] - widget.table["ci_low"].iloc[0]
    widget.interval.value = 80.0
    assert widget.table["ci_high"].iloc[0] - widget.table["ci_low"].iloc[0] < wide
    assert widget.figure.layout.annotations[1].text == "determinism tax (80% interval)"
    widget.warmup.value = 0
    assert widget.table["steps_deterministic"].iloc[0] == 30
    assert "deterministic_tokens_per_s" in widget.table.columns
    widget.measure.value = "steps/s (from the step time)"
    assert widget.figure.layout.yaxis.title.text == "steps per second"
    assert 9 < widget.table["tax_percent"].iloc[0] < 13
    headed = " ".join(widget.table.columns)  # the table printed under the figure (and exported) says what it holds
    assert "deterministic_steps_per_s" in headed and "tokens_per_s" not in headed
    widget.configs.value = ()
    assert widget.table.empty
    widget.configs.value = widget.configs.options
    widget.export_bar.folder.value, widget.export_bar.formats.value = str(tmp_path), ("html",)
    assert sorted(p.name for p in widget.export()) == ["determinism-cost.csv", "determinism-cost.html"]
    assert len(pd.read_csv(tmp_path / "determinism-cost.csv")) == 1


def test_bad_cost_arguments(folder: Path) -> None:
    ws = Workspace.open(folder)
    with pytest.raises(ArgumentError, match="tokens_per_s or step_time"):
        ws.cost(measure="loss")
    with pytest.raises(ArgumentError, match="between 0 and 100"):
        ws.cost(interval=100.0)


def test_an_attribution_study_adds_the_cost_of_each_source(tmp_path: Path) -> None:
    from workbench.determinism import describe, resolve

    rng = np.random.default_rng(1)
    runs = (("det", None, 1000.0), ("all-off", {}, 1000.0), ("splitk", {"splitk_gemm": True}, 800.0))
    for name, table, speed in runs:
        run = write_synthetic_run(tmp_path / name, steps=30, sites=4)
        deterministic = table is None
        requested = {"embedding_atomics": False, **(table or {})}
        sources = resolve(deterministic, None if deterministic else requested, on_gpu=False)
        _throughput(run, speed * (1 + 0.01 * rng.standard_normal(30)), deterministic=deterministic)
        update_manifest(run, determinism=describe(deterministic, sources=sources))
    widget = CostWidget(tmp_path)
    assert widget.workspace.roles.source_runs == {"splitk": "splitk_gemm"}  # type: ignore[union-attr]
    assert widget.by_source["config"].tolist() == ["splitk_gemm"]
    assert -25 < widget.by_source["tax_percent"].iloc[0] < -15  # 800 / 1000 - 1: the emulation is the slower
    assert widget.source_box.layout.display is None and "1 nondeterminism sources" in widget.status.value
    widget.export_bar.folder.value, widget.export_bar.formats.value = str(tmp_path / "out"), ("html",)
    assert {p.name for p in widget.export()} >= {"source-cost.html", "source-cost.csv"}

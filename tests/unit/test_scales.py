"""Does it matter? A difference judged against the noise floor and the seed-to-seed spread."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import zarr

from workbench.analysis.scales import (
    ScaleVerdict,
    judge_against_scales,
    spread,
)
from workbench.store.manifest import ModelSignature, RunManifest, manifest_fields
from workbench.store.synthetic import write_synthetic_run
from workbench.studies import views
from workbench.studies.summary import summarise
from workbench.studies.workspace import Workspace

MODEL = ModelSignature(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128, seq_length=32,
                       parameters=123_456)


def test_each_verdict_follows_from_the_two_ranges() -> None:
    final = {"ref": 2.0, "a": 2.0001, "b": 1.9999, "s1": 2.01, "s2": 1.98, "tiny": 2.00005, "mid": 2.005,
             "far": 2.1}
    table = judge_against_scales(final, reference="ref", runs=["tiny", "mid", "far"], floor_runs=["ref", "a", "b"],
                                 seed_runs=["ref", "s1", "s2"]).set_index("run")
    assert table["noise_floor"].tolist() == pytest.approx([2e-4] * 3)
    assert table["seed_spread"].tolist() == pytest.approx([0.03] * 3)
    assert table["verdict"].tolist() == [ScaleVerdict.WITHIN_FLOOR, ScaleVerdict.WITHIN_SEEDS,
                                         ScaleVerdict.BEYOND_SEEDS]
    assert table.loc["mid", "difference"] == pytest.approx(0.005)
    no_seeds = judge_against_scales(final, reference="ref", runs=["mid"], floor_runs=["a", "b"], seed_runs=[])
    assert no_seeds["verdict"].tolist() == [ScaleVerdict.BEYOND_FLOOR] and math.isnan(no_seeds["seed_spread"][0])
    alone = judge_against_scales(final, reference="ref", runs=["mid"], floor_runs=[], seed_runs=["s1"])
    assert alone["verdict"].tolist() == [ScaleVerdict.NO_SCALE]  # one seed run is no spread
    assert math.isnan(spread([1.0, math.nan])) and spread([1.0, 3.0, math.nan]) == 2.0


def test_a_difference_and_a_floor_in_the_last_places_of_the_loss_are_unresolved() -> None:
    ulp = float(np.spacing(np.float32(2.0)))  # 2.4e-7: what short fp32 runs end apart
    final = {"ref": 2.0, "r1": 2.0 + ulp, "near": 2.0 + 2 * ulp, "same": 2.0, "bug": 2.0 + 1e-4}
    table = judge_against_scales(final, reference="ref", runs=["near", "same", "bug"], floor_runs=["ref", "r1"],
                                 seed_runs=[]).set_index("run")
    assert table.loc["near", "verdict"] == ScaleVerdict.UNRESOLVED  # once within, once beyond, in earlier sweeps
    assert table.loc["same", "verdict"] == ScaleVerdict.WITHIN_FLOOR  # no difference at all
    assert table.loc["bug", "verdict"] == ScaleVerdict.BEYOND_FLOOR
    wide = judge_against_scales({**final, "r1": 2.01}, reference="ref", runs=["near"], floor_runs=["ref", "r1"],
                                seed_runs=[])
    assert wide["verdict"].tolist() == [ScaleVerdict.WITHIN_FLOOR]  # a floor the loss resolves decides


def _run(root: Path, name: str, *, seed: int, deterministic: bool = True, precision: str = "fp32",
         val_loss: float = 2.0) -> None:
    """A store whose manifest is a user loop's (so the roles come from seed, determinism and precision), with a
    validation loss at steps 2 and 5."""
    run_dir = write_synthetic_run(root / name, steps=6, sites=10, seed=0)
    meta_path = run_dir / "run.zarr" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    for key in ("config", "config_hash", "synthetic", "fault"):
        meta["attributes"].pop(key, None)
    meta["attributes"].update(manifest_fields(RunManifest(
        run_id=f"{name}-1", name=name, producer="user loop", model=MODEL, precision=precision,
        deterministic=deterministic, seed=seed)))
    meta_path.write_text(json.dumps(meta))
    values = np.full(6, np.nan)
    values[2], values[5] = val_loss + 0.5, val_loss
    zarr.open_array(run_dir / "run.zarr" / "scalars" / "val_loss", mode="r+")[:] = values


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scales")
    _run(root, "ref", seed=1, val_loss=2.0)
    _run(root, "ref-again", seed=1, val_loss=2.0)
    _run(root, "nd-a", seed=1, deterministic=False, val_loss=2.0001)
    _run(root, "nd-b", seed=1, deterministic=False, val_loss=1.9999)
    _run(root, "seed2", seed=2, val_loss=2.01)
    _run(root, "seed3", seed=3, val_loss=1.98)
    _run(root, "half", seed=1, precision="bf16", val_loss=2.005)
    _run(root, "half-seed2", seed=2, precision="bf16", val_loss=2.03)  # another config's seeds: not the scale
    return root


def test_the_workspace_finds_the_seed_runs_and_judges_the_others(study: Path) -> None:
    ws = Workspace.open(study)
    assert ws.roles.reference == "ref"
    assert ws.roles.seed_runs == ["ref", "ref-again", "seed2", "seed3"]
    assert set(ws.roles.others) == {"half", "half-seed2"}  # neither the floor nor the reference's seeds
    low, high = ws.scalar_seed_spread("val_loss")
    assert (low[5], high[5]) == (1.98, 2.01) and math.isnan(low[0])
    step, table = ws.scales("val_loss", ["half"])
    assert step == 5  # the last step where every run has a validation loss
    assert table["verdict"].tolist() == [ScaleVerdict.WITHIN_SEEDS]
    assert table["seed_spread"][0] == pytest.approx(0.03) and table["noise_floor"][0] == pytest.approx(2e-4)
    seeds = ws.seed_ladder()
    assert seeds is not None and list(seeds.summary["run"]) == ["seed2", "seed3"]
    assert "does it matter? held-out validation loss after step 5" in summarise(ws).text()


def test_without_other_seeds_there_is_no_spread(tmp_path: Path) -> None:
    _run(tmp_path, "ref", seed=1)
    _run(tmp_path, "half", seed=1, precision="bf16")
    ws = Workspace.open(tmp_path)
    assert ws.roles.seed_runs == [] and ws.scalar_seed_spread("val_loss") is None and ws.seed_ladder() is None
    step, table = ws.scales("val_loss")
    assert step == 5 and table["verdict"].tolist() == [ScaleVerdict.NO_SCALE]


def _band(figure, name: str) -> list[float]:  # type: ignore[no-untyped-def]
    """The upper (or left) panel's band called ``name``: its polygon's y values."""
    return next(list(t.y) for t in figure.data if t.name == name and t.yaxis in (None, "y"))


def test_the_trajectory_widget_draws_both_bands_of_the_validation_loss(study: Path) -> None:
    from workbench.figures.style import NOISE_FLOOR, SEED_SPREAD
    from workbench.widgets.trajectories import TrajectoryWidget

    widget = TrajectoryWidget(study, runs=["ref", "half"], quantity="val_loss")
    seeds = _band(widget.figure, SEED_SPREAD)  # steps 2 and 5 there and back: the steps with a value
    assert seeds == pytest.approx([2.48, 1.98, 2.01, 2.51])
    assert _band(widget.figure, NOISE_FLOOR) == pytest.approx([2.4999, 1.9999, 2.0001, 2.5001])
    widget.seeds.value = False
    assert SEED_SPREAD not in {t.name for t in widget.figure.data}
    widget.seeds.value, widget.floor.value = True, False
    assert {t.name for t in widget.figure.data} >= {SEED_SPREAD} and NOISE_FLOOR not in {
        t.name for t in widget.figure.data}


def test_the_ladder_widget_draws_the_seed_spread(study: Path) -> None:
    from workbench.figures.style import SEED_SPREAD
    from workbench.widgets.ladder import LadderWidget

    widget = LadderWidget(study, runs=["half"])
    assert SEED_SPREAD in {t.name for t in widget.figure.data}
    widget.seeds.value = False
    assert SEED_SPREAD not in {t.name for t in widget.figure.data}


def test_the_report_and_the_figure_verb_draw_both_bands(study: Path, tmp_path: Path) -> None:
    """One view layer (``studies.views``): the report's loss trajectory and ladder carry the seed-to-seed spread
    and the noise floor, as ``workbench figure`` and the widgets draw them."""
    from workbench.cli import main
    from workbench.figures.style import NOISE_FLOOR, SEED_SPREAD
    from workbench.studies.report import report_figures

    ws = Workspace.open(study)
    figures = report_figures(ws)
    for name in ("loss", "ladder"):
        assert {SEED_SPREAD, NOISE_FLOOR} <= {trace.name for trace in figures[name].data}, name
    for timing in ("tokens_per_s", "step_time"):  # bands of the numbers say nothing of the speed
        assert not {SEED_SPREAD, NOISE_FLOOR} & {trace.name for trace in views.trajectories(ws, timing).figure.data}
    for kind in ("trajectories", "ladder"):
        out = tmp_path / f"{kind}.html"
        assert main(["figure", kind, str(study), "-o", str(out), "--data", str(tmp_path / f"{kind}.csv")]) == 0
        assert SEED_SPREAD in out.read_text() and (tmp_path / f"{kind}.csv").stat().st_size > 0

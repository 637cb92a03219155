"""Replay and bisect on real Megatron Core runs (CPU, gloo): the mini demo's runs, traced again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.analysis.anomalies import find_anomalies
from workbench.cli import main
from workbench.config import load_run_config
from workbench.errors import LaunchError
from workbench.investigate.bisect import bisect
from workbench.investigate.replay import replay
from workbench.runner.launch import launch
from workbench.store.reader import open_run


def test_fault_run_says_so_and_its_nan_is_found(mini_demo: Path) -> None:
    run = open_run(mini_demo / "fault")
    assert run.attrs["fault"] == "flip bit 30 of element 0 of act:layers.1.mlp at step 5"
    found = find_anomalies(run.scalars, run.records())
    assert (int(found["step"].iloc[0]), found["rule"].iloc[0]) == (5, "nonfinite")
    assert open_run(mini_demo / "det-r0").scalars["loss"].notna().all()


def test_replay_of_a_deterministic_run_reproduces_the_fault_bitwise(mini_demo: Path, tmp_path: Path) -> None:
    result = replay(mini_demo / "fault", 5, out=tmp_path / "replay")
    assert (result.from_step, result.from_checkpoint) == (4, True)
    assert result.check.reproduced, result.check.summary()
    assert result.check.steps == [4, 5] and result.check.sites > 100
    replayed = open_run(tmp_path / "replay")
    assert replayed.attrs["replay"]["of_run_id"] == open_run(mini_demo / "fault").run_id
    assert replayed.first_step == 4 and replayed.steps_completed == 6
    assert len(replayed.snapshots()[5]) == len(replayed.records().sites)  # every site snapshotted at step K
    assert replayed.scalars.loc[5, "loss"] != replayed.scalars.loc[5, "loss"]  # the NaN, again


def test_replay_of_a_nondeterministic_run_says_why_it_departs(mini_demo: Path, tmp_path: Path) -> None:
    result = replay(mini_demo / "nondet-r0", 2, out=tmp_path / "replay")
    assert result.from_step == 0 and not result.check.reproduced
    assert result.check.first_step == 0 and result.check.first_site == "grad:embedding.word_embeddings.weight"
    assert "cannot be expected" in result.check.summary()
    assert 0 < result.check.closeness["max_site_rel"].max() < 1e-3  # close, not equal


def test_bisect_finds_the_emulated_nondeterministic_embedding_gradient(mini_demo: Path, tmp_path: Path) -> None:
    result = bisect(mini_demo / "nondet-r0", mini_demo / "nondet-r1", out=tmp_path)
    assert (result.step, result.site) == (0, "grad:embedding.word_embeddings.weight")
    origin = result.operation.origin
    assert result.operation.verdict == "origin"
    assert (origin.phase, origin.scope, origin.op) == ("backward", "embedding.word_embeddings", "randperm")
    source = Path(__file__).resolve().parents[2] / "workbench" / "recorder" / "nondeterminism.py"
    line = next(i for i, text in enumerate(source.read_text().splitlines(), 1) if "torch.randperm(flat_index" in text)
    assert origin.source.startswith(f"workbench/recorder/nondeterminism.py:{line}"), origin.source  # the README's line
    assert json.loads((tmp_path / "bisect.json").read_text())["operation"]["origin"]["op"] == "randperm"
    assert (tmp_path / "operations.html").stat().st_size > 1_000_000  # plotly.js inline: opens offline


def test_bisect_finds_the_injected_change_in_the_mlp(mini_demo: Path, tmp_path: Path) -> None:
    result = bisect(mini_demo / "det-r0", mini_demo / "fault", out=tmp_path)
    assert (result.step, result.site) == (5, "act:layers.1.mlp")
    origin = result.operation.origin
    assert (origin.run, origin.phase, origin.scope, origin.microbatch) == ("b", "forward", "layers.1.mlp", 0)
    assert origin.source.startswith("workbench/runner/faults.py")
    assert all(r.check.reproduced for r in result.replays)


def test_bisect_traces_tp2_to_the_first_reduction_tp1_does_not_have(mini_demo: Path, tmp_path: Path) -> None:
    result = bisect(mini_demo / "det-r0", mini_demo / "tp2", out=tmp_path)
    assert (result.step, result.site) == (0, "act:layers.0.self_attention")
    origin = result.operation.origin
    assert (origin.run, origin.scope, origin.op) == ("b", "layers.0.self_attention.linear_proj", "c10d.allreduce_")
    assert "tensor_parallel/mappings.py" in origin.source


def test_cli_bisect_and_replay(mini_demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bisect", str(mini_demo / "det-r0"), str(mini_demo / "det-r1"), "--out", str(tmp_path / "b")]) == 0
    assert "bitwise identical at every common step" in capsys.readouterr().out
    assert (tmp_path / "b" / "bisect.md").is_file()
    assert main(["replay", str(mini_demo / "fault"), "--step", "9"]) == 2
    assert "not a step of fault" in capsys.readouterr().err


def test_a_fault_site_the_model_lacks_fails_the_run(tmp_path: Path) -> None:
    cfg = load_run_config(Path(__file__).parents[1] / "mini_demo_base.toml").with_overrides(
        {"name": "badfault", "fault.kind": "scale", "fault.site": "act:layers.7.mlp"})
    with pytest.raises(LaunchError, match="names no module or parameter"):
        launch(cfg, tmp_path / "badfault")

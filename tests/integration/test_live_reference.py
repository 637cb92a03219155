"""A run compared with its reference while it trains (``--against``): a bitwise twin trains to the end, a run
with one flipped bit stops within one flush of it, on TP=2 and PP=2, from a golden file and in a user's loop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.training import Runs, tiny_config, train_user_loop
from workbench.errors import IncomparableRunsError
from workbench.runner.launch import launch
from workbench.store.reader import open_run

FAULT = {"kind": "bitflip", "site": "act:layers.1.mlp", "step": 3, "bit": 30}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Six-step references, flushing every second step, at TP=1, TP=2 and PP=2."""
    return Runs(tmp_path_factory.mktemp("live-references"))


def _six(**overrides: object) -> dict[str, object]:
    """The tiny config for six steps, flushing and checkpointing every second step."""
    return {"steps": 6, "flush_every": 2, "checkpoint_every": 2, **overrides}


FLIP_TOML = """name = "flip"
steps = 6
global_batch_size = 8
micro_batch_size = 2
checkpoint_every = 2
flush_every = 2
fault = { kind = "bitflip", site = "act:layers.1.mlp", step = 3, bit = 30 }
[model]
num_layers = 2
hidden_size = 64
num_attention_heads = 4
vocab_size = 128
seq_length = 32
[optim]
lr = 0.01
min_lr = 0.001
warmup_steps = 2
[record]
compile = false
"""
"""``tiny_config("flip", **_six(fault=FAULT))`` as the file a user passes to ``workbench run``."""


def test_a_bitwise_twin_trains_to_the_end(references: Runs, tmp_path: Path) -> None:
    reference = references.get("ref", **_six())  # type: ignore[arg-type]
    launch(tiny_config("twin", **_six()), tmp_path / "twin", against=reference)
    run = open_run(tmp_path / "twin")
    assert run.status == "complete" and run.steps_completed == 6 and "diverged" not in run.attrs


@pytest.mark.parametrize("layout", [{}, {"layout.tp": 2}, {"layout.pp": 2}], ids=["tp1", "tp2", "pp2"])
def test_one_flipped_bit_stops_every_rank_within_one_flush(references: Runs, tmp_path: Path,
                                                           layout: dict[str, int]) -> None:
    name = "ref-" + ("-".join(f"{k.split('.')[1]}{v}" for k, v in layout.items()) or "tp1")
    reference = references.get(name, **_six(**layout))  # type: ignore[arg-type]
    config = tiny_config("flip", **_six(**layout, fault=FAULT))
    launch(config, tmp_path / "flip", against=reference)
    run = open_run(tmp_path / "flip")
    diverged = run.attrs["diverged"]
    assert run.status == "diverged" and diverged["step"] == 3 and diverged["site"] == "act:layers.1.mlp"
    assert diverged["reference"] == open_run(reference).run_id
    assert run.steps_completed <= 3 + 2  # stopped at the flush after step 3: steps 0-3 written, never all six
    assert diverged["stopped_after"] == 3 and run.steps_completed == 4
    assert 2 in run.paths.checkpoint_steps()  # the checkpoint before the step is kept, for the replay


def test_the_command_exits_1_and_says_what_to_run_next(references: Runs, tmp_path: Path) -> None:
    reference = references.get("ref", **_six())  # type: ignore[arg-type]
    config = tmp_path / "flip.toml"
    config.write_text(FLIP_TOML)
    done = _cli("run", str(config), "--out", str(tmp_path / "runs"), "--against", str(reference))
    assert done.returncode == 1, done.stderr[-2000:]
    assert "DIVERGED" in done.stdout and "at step 3: act:layers.1.mlp" in done.stdout
    assert f"workbench replay {tmp_path / 'runs' / 'flip'} --step 3" in done.stdout
    assert "workbench bisect" in done.stdout
    listed = _cli("ls", str(tmp_path / "runs"))
    assert "diverged" in listed.stdout


def test_a_golden_file_stops_at_the_first_step_that_differs(references: Runs, tmp_path: Path) -> None:
    reference = references.get("ref", **_six())  # type: ignore[arg-type]
    golden = tmp_path / "golden.json"
    assert _cli("golden", str(reference), "--out", str(golden)).returncode == 0
    launch(tiny_config("flip", **_six(fault=FAULT)), tmp_path / "flip", against=golden)
    diverged = open_run(tmp_path / "flip").attrs["diverged"]
    assert diverged["step"] == 3 and diverged["reference"] == str(golden)


def test_keep_going_records_the_verdict_and_trains_on(references: Runs, tmp_path: Path) -> None:
    reference = references.get("ref", **_six())  # type: ignore[arg-type]
    launch(tiny_config("flip", **_six(fault=FAULT)), tmp_path / "flip", against=reference,
           keep_going=True)
    run = open_run(tmp_path / "flip")
    assert run.status == "complete" and run.steps_completed == 6
    assert run.attrs["diverged"]["step"] == 3 and run.attrs["diverged"]["stopped_after"] is None


def test_a_reference_that_cannot_serve_is_refused_before_anything_is_written(references: Runs,
                                                                              tmp_path: Path) -> None:
    reference = references.get("ref", **_six())  # type: ignore[arg-type]
    with pytest.raises(IncomparableRunsError, match="another model"):
        launch(tiny_config("wide", **_six(**{"model.hidden_size": 32})), tmp_path / "wide",
               against=reference)
    with pytest.raises(IncomparableRunsError, match="lacks|it lacks"):
        launch(tiny_config("long", **_six(steps=8)), tmp_path / "long", against=reference)
    assert not (tmp_path / "wide").exists() and not (tmp_path / "long").exists()


def test_a_user_loop_raises_on_every_rank(user_runs: Path, tmp_path: Path) -> None:
    flipped = train_user_loop(tmp_path / "flip", "--tp", "2", "--flip", "2:decoder.layers.1.mlp", "--against",
                              str(user_runs / "tp2"), "--flush-every", "2", ok=False)
    assert flipped.returncode != 0
    assert flipped.stdout.count("DIVERGED 2 act:layers.1.mlp") == 2, flipped.stdout[-2000:] + flipped.stderr[-2000:]
    run = open_run(tmp_path / "flip")
    assert run.status == "diverged" and run.attrs["diverged"]["stopped_after"] == 3
    twin = train_user_loop(tmp_path / "twin", "--tp", "2", "--against", str(user_runs / "tp2"), "--flush-every", "2")
    assert open_run(tmp_path / "twin").status == "complete", twin.stdout[-2000:]
    json.dumps(run.attrs["diverged"])


def test_a_user_loop_refuses_an_unreadable_reference_on_every_rank(tmp_path: Path) -> None:
    refused = train_user_loop(tmp_path / "refused", "--tp", "2", "--against", str(tmp_path / "absent"), ok=False)
    assert refused.returncode != 0 and refused.stderr.count("IncomparableRunsError") >= 2  # no rank left waiting
    assert "absent" in refused.stderr and not (tmp_path / "refused").exists()

"""Golden-values files: Megatron-LM's format checked with its semantics, the workbench's checked bitwise,
and Megatron-LM's TensorBoard scalars imported as a run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.analysis.golden_values import (
    GoldenFileError,
    GoldenValues,
    golden_values_check,
    megatron_golden_values,
    parse_golden_values,
    weights_fingerprints,
    workbench_golden_values,
)
from workbench.cli import main as cli
from workbench.statistics import FINGERPRINT_VERSION
from workbench.store.golden_file import read_golden_document
from workbench.store.golden_file import write_golden_document as write_golden_values


def read_golden_values(path: Path) -> GoldenValues:
    """A golden file read as the command line reads it: the document from disk, then its values."""
    return parse_golden_values(read_golden_document(path), str(path))


def scalars(steps: int = 50, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"loss": 10.0 - np.arange(steps) * 0.01 + rng.normal(0, 1e-3, steps),
                          "grad_norm": rng.uniform(1, 2, steps), "lr": np.full(steps, 1e-4),
                          "loss_scale": np.full(steps, 1.0), "step_time": rng.uniform(0.1, 0.2, steps)})
    frame.index.name = "step"
    return frame


def megatron_file(tmp_path: Path, values: pd.DataFrame, **extra: dict) -> Path:
    data = {"lm loss": {"start_step": 1, "end_step": len(values), "step_interval": 1,
                        "values": {str(k + 1): round(float(v), 5) for k, v in values["loss"].items()}},
            "num-zeros": {"start_step": 1, "end_step": 2, "step_interval": 1, "values": {"1": 5.0, "2": 6.0}},
            **extra}
    path = tmp_path / "golden_values_dev_dgx_h100.json"
    path.write_text(json.dumps(data))
    return path


def test_a_megatron_file_is_read_one_based_and_checked_at_five_decimals(tmp_path: Path) -> None:
    run = scalars()
    golden = read_golden_values(megatron_file(tmp_path, run))
    assert golden.format == "megatron" and list(golden.scalars.index[:2]) == [0, 1]  # iteration 1 is step 0
    assert golden.unmapped == ("num-zeros",)
    check = golden_values_check(run, None, golden, run="r")
    assert check.passed and check.scalars == ("loss",) and len(check.steps) == 50
    assert any("num-zeros" in n for n in check.notes)
    shifted = run.copy()
    shifted.loc[7, "loss"] += 2e-5  # visible at 5 decimals
    check = golden_values_check(shifted, None, golden, run="r")
    assert not check.passed and [d.step for d in check.differences] == [7]
    actual, expected = (float(v) for v in check.differences[0].detail.split(" vs "))  # plain numbers, no np.float64()
    assert actual == np.round(shifted.loc[7, "loss"], 5) and expected == np.round(run.loc[7, "loss"], 5)
    shifted.loc[7, "loss"] = run.loc[7, "loss"] + 1e-9  # lost to the rounding, as in Megatron-LM
    assert golden_values_check(shifted, None, golden, run="r").passed


def test_megatron_approximate_check_lets_one_step_in_a_hundred_fail(tmp_path: Path) -> None:
    run = scalars()
    golden = read_golden_values(megatron_file(tmp_path, run))
    off = run.copy()
    off.loc[3, "loss"] *= 1.01
    check = golden_values_check(off, None, golden, run="r", rtol=1e-5)
    assert check.passed and any("1 of 50 steps outside rtol" in n for n in check.notes)  # min(max(50//100,1),50)=1
    off.loc[9, "loss"] *= 1.01
    check = golden_values_check(off, None, golden, run="r", rtol=1e-5)
    assert not check.passed and sorted(d.step for d in check.differences) == [3, 9]
    assert golden_values_check(off, None, golden, run="r", rtol=0.02).passed


def test_megatron_nan_is_infinity_on_both_sides(tmp_path: Path) -> None:
    run = scalars(steps=4)
    run.loc[2, "loss"] = math.nan
    data = megatron_golden_values(run)
    assert data["lm loss"]["values"]["3"] == "nan" and data["lm loss"]["start_step"] == 1
    path = write_golden_values(data, tmp_path / "g.json")
    golden = read_golden_values(path)
    assert golden_values_check(run, None, golden, run="r").passed
    finite = run.copy()
    finite.loc[2, "loss"] = 1.0
    assert [d.step for d in golden_values_check(finite, None, golden, run="r").differences] == [2]
    assert any("timing" in n for n in golden_values_check(run, None, golden, run="r").notes)  # iteration-time


def test_a_megatron_file_with_every_fifth_iteration(tmp_path: Path) -> None:
    run = scalars(steps=20)
    data = megatron_golden_values(run, interval=5)
    assert list(data["lm loss"]["values"]) == ["1", "5", "10", "15", "20"]
    golden = read_golden_values(write_golden_values(data, tmp_path / "g.json"))
    check = golden_values_check(run, None, golden, run="r")
    assert check.passed and check.steps == [0, 4, 9, 14, 19]
    assert not golden_values_check(run.iloc[:10], None, golden, run="short").passed  # steps the run lacks


def fingerprints(steps: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    sites = ["param:a.weight", "param:b.weight", "act:a", "grad:a.weight"]
    return pd.DataFrame(rng.integers(0, 2**63, (steps, len(sites)), dtype=np.uint64), columns=sites)


def test_weight_fingerprints_change_with_one_parameter_site_only() -> None:
    base = fingerprints()
    weights = weights_fingerprints(base)
    assert all(isinstance(v, str) and v.startswith("0x") and len(v) == 18 for v in weights)
    changed = base.copy()
    changed.loc[1, "param:b.weight"] ^= np.uint64(1)
    other = weights_fingerprints(changed)
    assert (other != weights).tolist() == [False, True, False]
    changed = base.copy()
    changed.loc[1, "act:a"] ^= np.uint64(1)  # not a weight
    assert (weights_fingerprints(changed) == weights).all()


def test_a_workbench_file_keeps_full_precision_and_is_checked_bitwise(tmp_path: Path) -> None:
    run, weights = scalars(steps=3), weights_fingerprints(fingerprints())
    path = write_golden_values(workbench_golden_values(run, weights, run="r"), tmp_path / "g.json")
    data = json.loads(path.read_text())
    assert data["fingerprint_version"] == FINGERPRINT_VERSION and data["weights"]["0"] == weights[0]
    assert "step_time" not in data["scalars"]  # timing is the machine's, not the run's
    golden = read_golden_values(path)
    assert golden.format == "workbench"
    assert golden_values_check(run, weights, golden, run="r").passed
    one_ulp = run.copy()
    one_ulp.loc[1, "loss"] = np.nextafter(run.loc[1, "loss"], np.inf)
    check = golden_values_check(one_ulp, weights, golden, run="r")
    assert [(d.step, d.site) for d in check.differences] == [(1, "loss")]
    assert golden_values_check(one_ulp, weights, golden, run="r", rtol=1e-9).passed
    other = weights.copy()
    other[2] = "0x0000000000000000"
    check = golden_values_check(run, other, golden, run="r")
    assert [(d.step, d.site) for d in check.differences] == [(2, "weights")]
    check = golden_values_check(run, other, golden, run="r", rtol=1e-9)
    assert check.passed and any("weights not checked" in n for n in check.notes)
    assert not golden_values_check(run, None, golden, run="r").passed  # a run without param sites


@pytest.mark.parametrize("content, message", [
    ("not json", "not JSON"),
    ('{"lm loss": [1, 2]}', "neither Megatron-LM's golden-values format"),
    ('{"format": "workbench-golden-values", "version": 7}', "version 7"),
    ('{"format": "workbench-golden-values", "version": 1, "fingerprint_version": 99, "steps": [0], '
     '"weights": {"0": "0x1"}}', "definition version 99"),
    ('{"format": "workbench-golden-values", "version": 1, "steps": [0, 1], "scalars": {"loss": [1.0]}}',
     "one value per step"),
    ('{"lm loss": {"start_step": 1, "end_step": 1, "step_interval": 1, "values": {"one": 1.0}}}', "whole number"),
    ('{"lm loss": {"start_step": 1, "end_step": 1, "step_interval": 1, "values": {"1": "high"}}}', "not a number"),
])
def test_a_file_of_another_format_is_one_line_saying_what_was_expected(tmp_path: Path, content: str,
                                                                       message: str) -> None:
    path = tmp_path / "g.json"
    path.write_text(content)
    with pytest.raises(GoldenFileError, match=message):
        read_golden_values(path)
    with pytest.raises(GoldenFileError, match="no such golden-values file"):
        read_golden_values(tmp_path / "absent.json")


def test_a_failed_write_leaves_no_partial_file(tmp_path: Path) -> None:
    folder = tmp_path / "golden.json"
    folder.mkdir()  # a folder where the file should go: the final rename fails
    with pytest.raises(OSError):
        write_golden_values({"format": "any"}, folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["golden.json"] and list(folder.iterdir()) == []


def write_megatron_tensorboard(logdir: Path, iterations: list[int]) -> None:
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    logdir.mkdir(parents=True)
    writer = EventFileWriter(str(logdir))
    for k in iterations:
        for tag, value in (("lm loss", 10.0 - 0.25 * k), ("grad-norm", 1.5), ("iteration-time", 0.5),
                           ("num-zeros", 3.0), ("lm loss vs samples", 1.0)):
            writer.add_event(Event(wall_time=0.0, step=k, summary=Summary(value=[
                Summary.Value(tag=tag, simple_value=value)])))
        if k % 2 == 0:  # evaluate_and_print_results every --eval-interval 2 iterations
            writer.add_event(Event(wall_time=0.0, step=k, summary=Summary(value=[
                Summary.Value(tag="lm loss validation", simple_value=11.0 - 0.25 * k)])))
    writer.close()


def test_megatron_tensorboard_scalars_become_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.store.reader import open_run

    write_megatron_tensorboard(tmp_path / "tb", [1, 2, 4, 6])
    assert cli(["import-megatron", str(tmp_path / "tb"), "--out", str(tmp_path / "mlm"), "--tokens-per-step",
                "1000"]) == 0
    run = open_run(tmp_path / "mlm")
    assert run.status == "complete" and run.manifest.producer == "import: megatron-lm tensorboard"
    assert run.steps_completed == 6 and not run.has_sites
    loss = run.scalars["loss"]
    assert loss[0] == 9.75 and loss[3] == 9.0 and math.isnan(loss[2])  # iteration 4 is step 3; 3 was not logged
    assert run.scalars["tokens_per_s"][0] == 2000.0
    val = run.scalars["val_loss"]  # after iteration k's update: step k - 1
    assert val[1] == 10.5 and val[5] == 9.5 and math.isnan(val[0]) and math.isnan(val[4])
    assert "num-zeros" in run.attrs["imported"]["other_tags"]
    assert "lm loss validation" not in run.attrs["imported"]["other_tags"]
    assert cli(["ls", str(tmp_path)]) == 0
    assert cli(["golden", str(tmp_path / "mlm"), "--megatron", "--out", str(tmp_path / "g.json")]) == 0
    assert cli(["check", str(tmp_path / "mlm"), "--golden", str(tmp_path / "g.json")]) == 0
    (tmp_path / "empty").mkdir()
    assert cli(["import-megatron", str(tmp_path / "empty"), "--out", str(tmp_path / "x")]) == 2
    assert cli(["import-megatron", str(tmp_path / "absent"), "--out", str(tmp_path / "x")]) == 2
    assert "no 'lm loss' scalar" in capsys.readouterr().err


@pytest.mark.parametrize("text, reason", [
    ('{"lm loss": {"start_step": 1, "end_step": 2, "step_interval": 1, "values": {"1": NaN, "2": 1.0}}}',
     "the literal NaN is not JSON"),
    ('{"lm loss": {"start_step": 1, "end_step": 1, "step_interval": 1, "values": {"1": Infinity}}}',
     "the literal Infinity"),
    ('{"lm loss": {"start_step": 1, "end_step": 1, "step_interval": 1, "values": {"1": 2.0, "1": 3.0}}}',
     "the key '1' appears twice"),
    ("[" * 100_000 + "]" * 100_000, "nested deeper"),
])
def test_a_golden_file_is_read_strictly(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "golden.json"
    path.write_text(text)
    with pytest.raises(GoldenFileError, match=reason):  # a WorkbenchError: one line and exit 2 at the command line
        read_golden_values(path)


def test_a_golden_file_larger_than_any_real_one_is_refused_before_it_is_read(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench import untrusted

    path = tmp_path / "golden.json"
    path.write_text('{"lm loss": {"start_step": 1, "end_step": 1, "step_interval": 1, "values": {"1": 2.0}}}')
    monkeypatch.setattr(untrusted.strict_json, "__kwdefaults__", {"max_bytes": 32})
    with pytest.raises(GoldenFileError, match="more than the 32 a JSON file may hold"):
        read_golden_values(path)

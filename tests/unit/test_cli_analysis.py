"""Analysis verbs of the CLI on synthetic run stores: answers, exit codes, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.store.synthetic import write_synthetic_run
from workbench.store.writer import update_manifest


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    a = write_synthetic_run(root / "a", steps=40, sites=60, seed=1)
    b = write_synthetic_run(root / "b", steps=40, sites=60, seed=1, diverge_at=(12, 30))
    same = write_synthetic_run(root / "same", steps=40, sites=60, seed=1)
    update_manifest(same, resumes=[20])
    return a, b, same


def test_compare_json_and_text(pair, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    a, b, _ = pair
    assert main(["compare", str(a), str(b), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["identical"] is False and result["first_step"] == 12 and len(result["common_steps"]) == 40
    assert result["first_site"] == result["origin_sites"][0] and len(result["common_sites"]) == 60
    assert result["growth_log10_per_step"] == pytest.approx(0.01, abs=0.003)  # the synthetic growth rate
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "first divergent step: 12" in out and "decades per step" in out


def test_check_and_resume_check_exit_codes(pair, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    a, b, same = pair
    assert main(["check", str(same), "--golden", str(a)]) == 0
    assert main(["check", str(b), "--golden", str(a), "--steps", "12"]) == 0  # differs only from step 12 on
    assert main(["check", str(b), "--golden", str(a), "--steps", "13"]) == 1
    assert "FAILED" in capsys.readouterr().out
    assert main(["resume-check", str(same), str(a)]) == 0
    assert "resumed at step 20" in capsys.readouterr().out
    assert main(["resume-check", str(b), str(a), "--from-step", "5"]) == 1
    assert "first differs at step 12" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["compare", "{missing}", "{a}"], "no such run"),
    (["compare", "{tmp}", "{a}"], "not a run store"),
    (["check", "{a}", "--golden", "{a}", "--rtol", "-1"], "rtol"),
    (["check", "{a}", "--golden", "{a}", "--steps", "0"], "--steps: '0' is not allowed: a whole number >= 1"),
    (["resume-check", "{a}", "{a}"], "never resumed"),
    (["resume-check", "{a}", "{a}", "--from-step", "99"], "no recorded step from step 99"),
    (["report", "{missing}", "-o", "{tmp}/r.html"], "make demo"),
])
def test_bad_inputs_give_one_line(pair, tmp_path: Path, capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
                                  argv: list[str], message: str) -> None:
    a, _, _ = pair
    args = [x.format(a=a, missing=tmp_path / "missing", tmp=tmp_path) for x in argv]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("workbench: error:") and len(err.splitlines()) == 1 and message in err, err


def test_runs_of_different_models_cannot_be_compared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_synthetic_run(tmp_path / "a", steps=5, sites=10)
    b = write_synthetic_run(tmp_path / "b", steps=5, sites=10)
    model = json.loads((b / "run.zarr" / "zarr.json").read_text())["attributes"]["model"]
    model["num_layers"] = 7  # the signature every reader compares, whoever produced the run
    update_manifest(b, model=model)
    assert main(["compare", str(a), str(b)]) == 2
    assert "model.num_layers" in capsys.readouterr().err


def test_import_te_logs_then_compare(pair, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from workbench.importers import write_te_log
    from workbench.store.reader import open_run

    a, b, _ = pair
    for name, run in (("a", a), ("b", b)):
        write_te_log(tmp_path / f"logs_{name}" / "nvdlfw_inspect_globalrank-0.log", open_run(run).records())
        assert main(["import-te", str(tmp_path / f"logs_{name}"), "--out", str(tmp_path / f"imported_{name}")]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "imported_a"), str(tmp_path / "imported_b"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["first_step"] == 12 and result["first_site"] == open_run(a).records().sites[30]
    assert main(["import-te", str(tmp_path / "nope.log"), "--out", str(tmp_path / "x")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_anomalies_verb(pair, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    import zarr

    a, _, _ = pair
    assert main(["anomalies", str(a)]) == 0
    assert "no anomalies in 40 steps" in capsys.readouterr().out
    spiky = write_synthetic_run(tmp_path / "spiky", steps=40, sites=20)
    zarr.open_array(spiky / "run.zarr" / "scalars" / "loss", mode="r+")[30] = 50.0
    assert main(["anomalies", str(spiky)]) == 1
    out = capsys.readouterr().out
    assert "loss_spike" in out and " 30 " in out


def test_a_run_started_at_another_layout_is_held_to_the_noise_floor(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    reference = write_synthetic_run(tmp_path / "tp1", steps=30, sites=20, seed=3)
    source = write_synthetic_run(tmp_path / "tp2", steps=30, sites=20, seed=3, diverge_at=(0, 0),
                                 initial_difference=1e-6)
    near = write_synthetic_run(tmp_path / "near", steps=30, sites=20, seed=3, diverge_at=(0, 0),
                               initial_difference=2e-6)
    far = write_synthetic_run(tmp_path / "far", steps=30, sites=20, seed=3, diverge_at=(0, 0),
                              initial_difference=1e-3)
    for run in (near, far):
        update_manifest(run, resumes=[10], started_from={"run": str(source), "step": 10})
    assert main(["resume-check", str(near), str(reference)]) == 0  # the floor: tp2's own distance to tp1
    out = capsys.readouterr().out
    assert "2.00 x the noise floor (tp2 vs tp1" in out and "within the floor" in out
    assert main(["resume-check", str(far), str(reference)]) == 1
    assert "above the floor" in capsys.readouterr().out
    # against the run it started from there is no floor to measure: bitwise or not, as a plain resume
    # (the synthetic fingerprints differ where the runs diverge, here alike in both)
    assert main(["resume-check", str(near), str(source)]) == 0
    assert "noise floor" not in capsys.readouterr().out


def test_the_reading_verbs_take_a_url_fsspec_reads(pair, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    fsspec = pytest.importorskip("fsspec")
    a, b, _ = pair
    memory, prefix = fsspec.filesystem("memory"), f"/cli-{tmp_path.name}"
    for run_dir in (a, b):
        memory.put(str(run_dir), f"{prefix}/{run_dir.name}", recursive=True)
    url_a, url_b = f"memory:/{prefix}/a", f"memory:/{prefix}/b"
    assert main(["compare", str(a), str(b), "--json"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert main(["compare", url_a, url_b, "--json"]) == 0  # kept as a URL: a Path would fold its "//"
    remote = json.loads(capsys.readouterr().out)
    assert remote["first_step"] == local["first_step"] == 12 and remote["first_site"] == local["first_site"]
    assert main(["check", url_b, "--golden", url_a, "--steps", "13"]) == 1
    assert "differ" in capsys.readouterr().out.lower()
    assert main(["anomalies", url_a]) == 0
    out = tmp_path / "golden.json"
    assert main(["golden", url_a, "--out", str(out)]) == 0 and out.is_file()
    assert main(["check", str(a), "--golden", str(out)]) == 0
    capsys.readouterr()
    assert main(["compare", f"memory:/{prefix}/nowhere", url_b]) == 2
    error = capsys.readouterr().err
    assert f"memory:/{prefix}/nowhere" in error and len(error.strip().splitlines()) == 1

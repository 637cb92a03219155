"""The command line on real runs and on bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.training import Runs
from workbench.store.reader import open_run


def workbench(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def test_bad_config_path_is_one_line(tmp_path: Path) -> None:
    result = workbench("run", str(tmp_path / "missing.toml"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "no such config file" in result.stderr


def test_bad_value_names_the_field(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('name = "bad"\nprecision = "fp64"\n')
    result = workbench("run", str(config))
    assert result.returncode == 2
    assert "precision = 'fp64'" in result.stderr and "'bf16'" in result.stderr


def test_ls_lists_runs(runs: Runs) -> None:
    runs.get("base")
    result = workbench("ls", str(runs.root))
    assert result.returncode == 0
    assert "base" in result.stdout and "complete" in result.stdout and "4/4" in result.stdout


def test_ls_of_a_missing_folder(tmp_path: Path) -> None:
    result = workbench("ls", str(tmp_path / "nowhere"))
    assert result.returncode == 2 and "no such directory" in result.stderr


def test_sweep_skips_complete_runs(tmp_path: Path) -> None:
    base = tmp_path / "base.toml"
    base.write_text('name = "b"\nsteps = 2\nglobal_batch_size = 4\nmicro_batch_size = 2\n'
                    "[model]\nnum_layers = 1\nhidden_size = 32\nnum_attention_heads = 2\nvocab_size = 64\n"
                    "seq_length = 8\n")
    study = tmp_path / "study.toml"
    study.write_text('name = "mini"\nbase = "base.toml"\n[matrix]\ndeterministic = [true, false]\n')
    first = workbench("sweep", str(study), "--out", str(tmp_path / "out"))
    assert first.returncode == 0, first.stderr
    assert "[2/2] nondet" in first.stderr
    stamp = (tmp_path / "out" / "det" / "run.zarr" / "zarr.json").stat().st_mtime_ns
    second = workbench("sweep", str(study), "--out", str(tmp_path / "out"))
    assert second.returncode == 0
    assert second.stderr.count("already complete, skipped") == 2
    assert (tmp_path / "out" / "det" / "run.zarr" / "zarr.json").stat().st_mtime_ns == stamp


def test_run_refuses_to_overwrite(runs: Runs, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('name = "again"\nsteps = 1\nglobal_batch_size = 2\nmicro_batch_size = 2\n'
                      "[model]\nnum_layers = 1\nhidden_size = 32\nnum_attention_heads = 2\nvocab_size = 64\n"
                      "seq_length = 8\n")
    assert workbench("run", str(config), "--out", str(tmp_path)).returncode == 0
    again = workbench("run", str(config), "--out", str(tmp_path))
    assert again.returncode == 2 and "already holds a run" in again.stderr  # bad input, not a failed run


def test_two_runs_launched_together_into_one_folder_one_wins_and_the_other_exits_2(tmp_path: Path) -> None:
    configs = []
    for seed in (1, 2):  # one name, one --out: one run folder; the seeds tell the runs apart
        configs.append(tmp_path / f"seed{seed}.toml")
        configs[-1].write_text(f'name = "same"\nsteps = 1\nseed = {seed}\nglobal_batch_size = 2\n'
                               'micro_batch_size = 2\n[model]\nnum_layers = 1\nhidden_size = 32\n'
                               'num_attention_heads = 2\nvocab_size = 64\nseq_length = 8\n')
    launches = [subprocess.Popen([sys.executable, "-m", "workbench.cli", "run", str(config), "--out",
                                  str(tmp_path / "runs")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for config in configs]
    results = [(launch.wait(timeout=600), launch.communicate()[1]) for launch in launches]
    assert sorted(code for code, _ in results) == [0, 2], results
    winner = [seed for seed, (code, _) in zip((1, 2), results) if code == 0][0]
    refused = [err for code, err in results if code == 2][0].strip().splitlines()[-1]
    assert "is being written by workbench run" in refused or "already holds a run" in refused, refused
    run = open_run(tmp_path / "runs" / "same")
    assert run.status == "complete" and run.config.seed == winner  # the winner's run, whole

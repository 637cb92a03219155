"""The command line on real runs and on bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.training import Runs


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
    assert again.returncode == 1 and "already holds a run" in again.stderr

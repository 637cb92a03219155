"""A megatron-core outside the tested range is one line where training starts; reading never asks."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from workbench import versions
from workbench.errors import UnsupportedError

ROOT = Path(__file__).resolve().parents[2]


def test_the_range_is_the_one_pyproject_declares() -> None:
    train = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    declared = [r.removeprefix("megatron-core") for r in train if r.startswith("megatron-core")]
    assert declared == [versions.MEGATRON_CORE]


@pytest.mark.parametrize("version", ["0.16.1", "0.17.0", "0.18.2", "0.19.2", "0.19.0rc0", "0.16.1+local"])
def test_releases_inside_the_range_pass(version: str) -> None:
    assert versions.check_megatron_core(version) == version


@pytest.mark.parametrize("version", ["0.16.0", "0.15.3", "0.20.0", "0.20.0rc0", "1.0.0", "dev"])
def test_releases_outside_the_range_are_one_line_naming_it(version: str) -> None:
    with pytest.raises(UnsupportedError) as caught:
        versions.check_megatron_core(version)
    message = str(caught.value)
    assert "\n" not in message and version in message and versions.MEGATRON_CORE in message


def test_no_megatron_core_at_all_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "megatron_core_version", lambda: None)
    with pytest.raises(UnsupportedError, match="not installed"):
        versions.check_megatron_core()


def test_workbench_run_refuses_a_release_outside_the_range_before_writing(tmp_path: Path) -> None:
    """An installed megatron-core 0.20.0 (a distribution found first on sys.path): exit 2, one line, no store."""
    fake = tmp_path / "site" / "megatron_core-0.20.0.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: megatron-core\nVersion: 0.20.0\n")
    env = {**os.environ, "PYTHONPATH": str(fake.parent)}
    out = tmp_path / "runs"
    done = subprocess.run([sys.executable, "-m", "workbench", "run", str(ROOT / "workbench/examples/tiny.toml"),
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "megatron-core 0.20.0" in lines[0] and versions.MEGATRON_CORE in lines[0]
    assert not any(out.rglob("manifest.json")) if out.exists() else True


def test_record_refuses_a_release_outside_the_range_before_writing(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    import torch

    from workbench.recorder import record

    monkeypatch.setattr(versions, "megatron_core_version", lambda: "0.20.0")
    with pytest.raises(UnsupportedError, match="outside the supported range"):
        record(tmp_path / "run", [torch.nn.Linear(2, 2)], None, steps=3)
    assert not (tmp_path / "run").exists()

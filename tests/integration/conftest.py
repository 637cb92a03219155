"""Real multi-process Megatron Core runs on CPU, trained once per test session and shared by its workers."""

from __future__ import annotations

import pytest

from tests.helpers.training import Runs, shared_dir


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(shared_dir(tmp_path_factory) / "runs")

"""Real multi-process Megatron Core runs on CPU, trained once per test session and shared."""

from __future__ import annotations

import pytest

from tests.helpers.training import Runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("runs"))

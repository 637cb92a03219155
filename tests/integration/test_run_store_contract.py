"""The run-store contract (``workbench.testing.run_store``) held against the producers that train: the
runner (``workbench run``) and ``record()`` in a user's own loop on two ranks, each read over and over while
it trains, flushing every step. The others: ``tests/unit/test_run_store_contract.py``."""

from __future__ import annotations

import pytest

from tests.helpers.training import tiny_config, train_user_loop
from workbench.testing.run_store import Produced, RunStoreContract, produce_watched


class TestRunner(RunStoreContract):
    @pytest.fixture(scope="class")
    def produced(self, tmp_path_factory: pytest.TempPathFactory) -> Produced:
        from workbench.runner.launch import launch

        out = tmp_path_factory.mktemp("runner") / "run"
        config = tiny_config("contract", steps=6, flush_every=1, checkpoint_every=0)
        return produce_watched(lambda: launch(config, out), out)


class TestRecordInAUserLoop(RunStoreContract):
    @pytest.fixture(scope="class")
    def produced(self, tmp_path_factory: pytest.TempPathFactory) -> Produced:
        out = tmp_path_factory.mktemp("record") / "run"
        return produce_watched(lambda: train_user_loop(out, "--steps", "6", "--flush-every", "1"), out)

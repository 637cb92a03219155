"""The run-store contract (``workbench.testing.run_store``) held against the producers that need no training:
the synthetic writer, and each importer (Transformer Engine debug logs, Megatron-LM's TensorBoard scalars, its
tensor dumps, its MoE router traces). The runner and ``record()`` are held to it in
``tests/integration/test_run_store_contract.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.dumps import EXPERTS, full_tensors, router_choices, write_dumps, write_router_traces
from workbench.importers.megatron_tb import import_megatron_tensorboard
from workbench.importers.te_log import import_te_log
from workbench.megatron_lm.dumps import import_megatron_dumps
from workbench.store.synthetic import write_synthetic_run
from workbench.testing.run_store import Produced, RunStoreContract, produce_watched

EXAMPLES = Path(__file__).resolve().parents[2] / "data" / "examples"


class TestSyntheticWriter(RunStoreContract):
    @pytest.fixture(scope="class")
    def produced(self, tmp_path_factory: pytest.TempPathFactory) -> Produced:
        out = tmp_path_factory.mktemp("synthetic") / "run"  # 130 recorded steps: two whole blocks and a part
        return produce_watched(lambda: write_synthetic_run(out, steps=130, sites=30, seed=2), out)


class TestTransformerEngineLog(RunStoreContract):
    @pytest.fixture(scope="class")
    def produced(self, tmp_path_factory: pytest.TempPathFactory) -> Produced:
        out = tmp_path_factory.mktemp("te") / "run"
        return produce_watched(lambda: import_te_log(EXAMPLES / "te_debug", out), out)


class TestMegatronTensorBoard(RunStoreContract):
    @pytest.fixture(scope="class")
    def produced(self, tmp_path_factory: pytest.TempPathFactory) -> Produced:
        out = tmp_path_factory.mktemp("mlm-tb") / "run"
        return produce_watched(lambda: import_megatron_tensorboard(EXAMPLES / "megatron_tb", out), out)


class TestMegatronDumps(RunStoreContract):
    @pytest.fixture(scope="class")
    def produced(self, tmp_path_factory: pytest.TempPathFactory) -> Produced:
        root = tmp_path_factory.mktemp("dumps")
        save = write_dumps(root / "save", 2, full_tensors(), iterations=(1, 2, 3))
        return produce_watched(lambda: import_megatron_dumps(save, root / "run", progress=lambda line: None),
                               root / "run")


class TestMegatronRouterTraces(RunStoreContract):
    @pytest.fixture(scope="class")
    def produced(self, tmp_path_factory: pytest.TempPathFactory) -> Produced:
        root = tmp_path_factory.mktemp("router")
        traces = write_router_traces(root / "traces", router_choices())
        return produce_watched(lambda: import_megatron_dumps(traces, root / "run", router_traces=traces,
                                                             experts=EXPERTS, progress=lambda line: None),
                               root / "run")

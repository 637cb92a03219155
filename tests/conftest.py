"""The suite's fixtures and markers; the helpers they are built from are in ``tests/helpers/``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.timing import FolderTimes
from tests.helpers.training import held, made_once, shared_dir, train_user_loop
from workbench.store.synthetic import write_synthetic_run

TESTS = Path(__file__).parent
IMPORTS_MEGATRON = re.compile(r"^\s*(import|from) megatron\b|importorskip\([\"']megatron|cpu_compat|"
                              r"workbench\.megatron_lm", re.MULTILINE)
"""What makes a unit or property module a ``releases`` one: it imports Megatron Core or the workbench's layer
over it."""

RELEASES = (
    # a user's loop at TP=2 and PP=2 (1F1B), recorded with record(...); Megatron's DDP under overlap_grad_reduce,
    # and the configurations record(...) refuses (their fields and classes are the release's)
    *(f"integration/test_user_loop.py::{test}" for test in (
        "test_every_kind_is_recorded_from_a_tp2_loop_that_calls_finalize_model_grads_itself",
        "test_two_runs_of_the_loop_are_bitwise_identical_one_with_a_validation_loss",
        "test_a_one_bit_change_is_found_at_its_step_and_module",
        "test_a_pipeline_parallel_loop_with_1f1b_logs_the_loss_from_its_last_stage",
        "test_overlapped_reduction_records_the_same_numbers_and_names_grad_local_missing",
        "test_the_distributed_optimizer_not_handed_to_record_is_refused_in_one_line")),
    # Megatron's own optimizers on the CPU (the CPU layer's type names), the distributed optimizer's shards
    # (its range map and state lookup are the release's), overlapped parameter gathering
    *(f"integration/test_distributed_optimizer.py::{test}" for test in (
        "test_every_kind_is_recorded_under_the_distributed_optimizer",
        "test_param_grad_and_update_are_the_full_tensors_the_loop_saw_at_every_step",
        "test_the_first_step_equals_megatrons_plain_optimizer")),
    "integration/test_recorder_api.py",  # the recorder's hooks on Megatron's modules
    "integration/test_megatron_pretrain.py",  # Megatron-LM's pretrain() (0.17+), each release's signature
    "integration/test_megatron_dumps.py",  # Megatron-LM's own dump functions (0.17+)
    "integration/test_hybrid_model.py",  # HybridModel (0.18+)
    "integration/test_resume.py",  # the runner's and dist_checkpointing's checkpoints, across layouts
    "integration/test_parallel_dimensions.py::test_the_virtual_pipeline_reorders_the_schedule_only",
    "integration/test_parallel_dimensions.py::test_an_expert_parallel_run_resumes_bitwise",  # MoE, EP
    "integration/test_precision_and_learning.py::test_fp16_uses_dynamic_loss_scaling",  # Megatron's grad scaler
)
"""The multi-process tests whose outcome can change with the megatron-core release: its schedules, checkpoint
formats, model classes, entry points and the CUDA-only call sites the CPU layer maps (docs/megatron-versions.md).
With the unit modules that import Megatron Core, they are marked ``releases``: what the floor environment
(megatron-core 0.16.1) runs. Everything else runs once, in the current environment."""

NOT_RELEASES = {"unit/test_run_store_contract.py"}
"""Unit modules that name ``workbench.megatron_lm`` for what reads files only (Megatron-LM's dumps and traces), no
release's code: not ``releases``, whatever ``IMPORTS_MEGATRON`` finds in them."""

INTEGRATION = {"integration", "notebooks", "browser"}
"""The folders whose tests launch real multi-process Megatron Core runs (the notebook and browser tests train
the mini demo): marked ``integration``, so that ``-m "not integration"`` leaves them out."""

def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``integration`` every test in ``INTEGRATION``'s folders, and ``releases`` the tests whose outcome can
    change with the megatron-core release (``RELEASES``, and the unit and property modules that import Megatron
    Core): ``make test`` runs the whole suite in the current environment and ``-m releases`` in the floor one."""
    verdicts: dict[Path, tuple[bool, bool]] = {}
    for item in items:
        path = Path(str(item.path))
        if path not in verdicts:
            part = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else ""
            verdicts[path] = (part in INTEGRATION, part in ("unit", "property")
                              and IMPORTS_MEGATRON.search(path.read_text()) is not None
                              and path.relative_to(TESTS).as_posix() not in NOT_RELEASES)
        integration, releases = verdicts[path]
        name = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else path.name
        test = f"{name}::{item.name.split('[', 1)[0]}"
        if integration:
            item.add_marker(pytest.mark.integration)
        if releases or name in RELEASES or test in RELEASES:
            item.add_marker(pytest.mark.releases)


_TIMES = FolderTimes()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _TIMES.add(report.nodeid, report.when, report.duration)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Each folder's seconds at the end of the session (``tests/helpers/timing.py``); ``make test`` collects them
    across its sessions and prints them beside their budgets (``tests/budget.py``)."""
    if hasattr(config, "workerinput"):
        return
    workers = config.getoption("numprocesses", None)
    workers = workers if isinstance(workers, int) and workers > 0 else 1
    for line in _TIMES.lines(workers):
        terminalreporter.write_line(line)
    if os.environ.get("WORKBENCH_TEST_TIMES"):
        _TIMES.save(os.environ["WORKBENCH_TEST_TIMES"], workers, os.environ.get("WORKBENCH_TEST_PHASE", "pytest"))


@pytest.fixture
def synthetic_run(tmp_path: Path) -> Path:
    return write_synthetic_run(tmp_path / "synthetic")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def mini_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo study in miniature (``tests/mini_demo.toml``), trained once per session, by whichever worker asks
    first, for the notebook, report and browser tests. ``WORKBENCH_MINI_DEMO=DIR`` keeps them in DIR across
    sessions (complete runs are not trained again)."""
    from workbench.studies.study import load_study, run_study

    study = load_study(Path(__file__).parent / "mini_demo.toml")
    kept = os.environ.get("WORKBENCH_MINI_DEMO")
    if kept:
        with held(Path(kept).parent / f"{Path(kept).name}.lock"):
            run_study(study, Path(kept), lambda *args: None)
        return Path(kept)
    return made_once(shared_dir(tmp_path_factory) / "mini-demo", lambda out: run_study(study, out, lambda *args: None))


@pytest.fixture(scope="session")
def user_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of four runs of the user loop: TP=2 twice (once without its validation loss), TP=2 with one
    flipped bit at step 2, PP=2; trained once per session, by whichever worker asks first."""

    def train(root: Path) -> None:
        root.mkdir(parents=True)
        train_user_loop(root / "tp2", "--tp", "2")
        train_user_loop(root / "tp2-again", "--tp", "2", "--eval-every", "0")
        train_user_loop(root / "tp2-flip", "--tp", "2", "--flip", "2:decoder.layers.1.mlp")
        train_user_loop(root / "pp2", "--pp", "2")

    return made_once(shared_dir(tmp_path_factory) / "user-runs", train)

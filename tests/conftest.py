"""The suite's fixtures and markers; the helpers they are built from are in ``tests/helpers/``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.stores import write_synthetic_run
from tests.helpers.timing import FolderTimes
from tests.helpers.training import train_user_loop

TESTS = Path(__file__).parent
TRAINS = re.compile(r"^\s*(import|from) (torch|megatron)\b|importorskip\([\"'](torch|megatron)|workbench\.runner|"
                    r"\blaunch\(|train_user_loop|\buser_runs\b", re.MULTILINE)
"""What makes a test module a ``training`` one: it imports torch or Megatron Core, or trains."""


INTEGRATION = {"integration", "notebooks", "browser"}
"""The folders whose tests launch real multi-process Megatron Core runs (the notebook and browser tests train
the mini demo): marked ``integration``, so that ``-m "not integration"`` leaves them out."""


RUNS_AS_MATERIAL = {"test_analysis.py", "test_cli.py", "test_live_reference.py", "test_report.py"}
"""Integration modules that train runs only as material for the workbench's own analysis, verbs, report and
live reference: what they ask of Megatron Core (the runner at TP/PP, the user loop) the other modules ask too,
so they are not ``training`` and the floor environment leaves them out."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``integration`` every test in ``INTEGRATION``'s folders, and ``training`` every test that imports
    torch or megatron or trains a run: ``make test`` runs the whole suite in one environment and ``-m training``
    in the other. The notebook and browser tests, and the integration modules in ``RUNS_AS_MATERIAL``, are not
    ``training``: they train runs only to have runs to show or analyse."""
    verdicts: dict[Path, tuple[bool, bool]] = {}
    for item in items:
        path = Path(str(item.path))
        if path not in verdicts:
            part = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else ""
            verdicts[path] = (part in INTEGRATION, (part == "integration" and path.name not in RUNS_AS_MATERIAL) or (
                part in ("unit", "property") and TRAINS.search(path.read_text()) is not None))
        integration, training = verdicts[path]
        if integration:
            item.add_marker(pytest.mark.integration)
        if training:
            item.add_marker(pytest.mark.training)


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
    """The demo study in miniature (``tests/mini_demo.toml``), trained once per session for the
    notebook, report and browser tests. ``WORKBENCH_MINI_DEMO=DIR`` keeps them in DIR across
    sessions (complete runs are not trained again)."""
    from workbench.studies.study import load_study, run_study

    kept = os.environ.get("WORKBENCH_MINI_DEMO")
    out = Path(kept) if kept else tmp_path_factory.mktemp("mini-demo")
    run_study(load_study(Path(__file__).parent / "mini_demo.toml"), out, lambda *args: None)
    return out


@pytest.fixture(scope="session")
def user_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of four runs of the user loop: TP=2 twice (once without its validation loss), TP=2 with one
    flipped bit at step 2, PP=2."""
    root = tmp_path_factory.mktemp("user-runs")
    train_user_loop(root / "tp2", "--tp", "2")
    train_user_loop(root / "tp2-again", "--tp", "2", "--eval-every", "0")
    train_user_loop(root / "tp2-flip", "--tp", "2", "--flip", "2:decoder.layers.1.mlp")
    train_user_loop(root / "pp2", "--pp", "2")
    return root

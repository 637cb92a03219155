"""Divergence workbench for Megatron Core: record, compare and explain training runs.

The names a user calls, all importable from here (``from workbench import open_run, compare, record``); the top
level imports no torch: ``record``, ``replay`` and ``bisect`` import it when first used.

    import workbench
    run = workbench.open_run("data/runs/demo/det-r0")
    ws = workbench.Workspace.open("data/runs/demo")          # a folder of runs, for notebooks
    print(workbench.describe(ws.comparison("det-r0", "nondet-r0"), "det-r0 vs nondet-r0"))

Runs and configs: ``open_run``, ``list_runs``, ``find_runs``, ``Run``, ``RunConfig``, ``load_run_config``.
Recording: ``record``. Comparing: ``compare``, ``compare_runs``, ``Comparison``, ``describe``,
``labelled_difference``. Checks: ``golden_check``, ``resume_check``; bug or rounding: ``rounding_verdict``.
Investigating: ``replay``, ``bisect``. A
folder of runs: ``Workspace``, ``runs_dir``, and its findings, ``summarise_study`` (what ``workbench summary``
prints). Errors: ``WorkbenchError`` and the classes of ``workbench.errors``.
Widgets are in ``workbench.widgets``, figures in ``workbench.figures``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._exports import lazy
from workbench.config import RunConfig, load_run_config
from workbench.errors import (
    ArgumentError,
    DamagedStoreError,
    IncomparableRunsError,
    NoSitesError,
    NotARunError,
    NotRecordedYetError,
    RunNotFoundError,
    UnsupportedError,
    WorkbenchError,
)
from workbench.store.reader import Run, find_runs, list_runs, open_run
from workbench.store.writer_lock import RunFolderBusy

if TYPE_CHECKING:
    from workbench.analysis.compare import Comparison, compare
    from workbench.analysis.difference import labelled_difference
    from workbench.analysis.findings import describe
    from workbench.analysis.golden import golden_check
    from workbench.analysis.resume import resume_check
    from workbench.investigate.bisect import bisect
    from workbench.investigate.replay import replay
    from workbench.recorder.session import record
    from workbench.studies.comparing import compare_runs
    from workbench.studies.summary import summarise_study
    from workbench.studies.verdicts import rounding_verdict
    from workbench.studies.workspace import Workspace, runs_dir

_LAZY = {"Comparison": "workbench.analysis.compare", "compare": "workbench.analysis.compare",
         "compare_runs": "workbench.studies.comparing", "labelled_difference": "workbench.analysis.difference",
         "describe": "workbench.analysis.findings", "golden_check": "workbench.analysis.golden",
         "resume_check": "workbench.analysis.resume", "bisect": "workbench.investigate.bisect",
         "replay": "workbench.investigate.replay", "record": "workbench.recorder.session",
         "Workspace": "workbench.studies.workspace", "runs_dir": "workbench.studies.workspace",
         "summarise_study": "workbench.studies.summary", "rounding_verdict": "workbench.studies.verdicts"}
__getattr__ = lazy(__name__, _LAZY, globals())

__all__ = ["ArgumentError", "Comparison", "DamagedStoreError", "IncomparableRunsError", "NoSitesError",
           "NotARunError", "NotRecordedYetError", "Run", "RunConfig", "RunFolderBusy", "RunNotFoundError",
           "UnsupportedError", "WorkbenchError", "Workspace", "bisect", "compare", "compare_runs", "describe",
           "find_runs", "golden_check", "labelled_difference", "list_runs", "load_run_config", "open_run", "record",
           "replay", "resume_check", "rounding_verdict", "runs_dir", "summarise_study"]
__version__ = "0.1.0"

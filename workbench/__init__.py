"""Divergence workbench for Megatron Core: record, compare and explain training runs.

The top level imports no torch: open and list runs anywhere.

    import workbench
    run = workbench.open_run("data/runs/demo/det-r0")
    run.scalars.loss.plot()
"""

from __future__ import annotations

from workbench.config import RunConfig, load_run_config
from workbench.errors import WorkbenchError
from workbench.store.reader import Run, list_runs, open_run

__all__ = ["Run", "RunConfig", "WorkbenchError", "list_runs", "load_run_config", "open_run"]
__version__ = "0.1.0"

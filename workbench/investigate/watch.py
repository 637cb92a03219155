"""Anomalies of a run while it trains: poll its store, report each new anomaly once.

    found = watch_anomalies("data/runs/demo/tp2", on_new=lambda row: print(row["step"], row["rule"]))

Every ``interval_s`` seconds the store is opened afresh and ``analysis.anomalies.find_anomalies``
runs over what it holds (its scalars, and its per-site records once the first recorded step is
written). Only completed flushes are read: the store's ``done`` flags are written after the rows
they vouch for, so a step is seen once its writer's flush has finished, never half-written, and
a step still in the training process's buffer is not seen yet. An anomaly is new when its
(step, rule, site) was not reported before; the rules judge a step by itself and the steps
before it, so later steps do not change earlier verdicts. One exception: a NaN/Inf first seen in
the scalars (site records lag them, or skip steps) is reported again, with its site, once the
site records hold one.

The watch ends when the run's status leaves 'created' / 'running' (complete, stopped, failed,
or interrupted: its launcher is gone), after one last look at the store, or after ``timeout_s``.
Imports no torch; reads only. Each poll analyses the whole run, so a long run with many sites
wants a longer ``interval_s``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pandas as pd

from workbench.analysis.anomalies import AnomalyRules, find_anomalies
from workbench.errors import ArgumentError, DamagedStoreError
from workbench.store import layout
from workbench.store.reader import open_run

IN_PROGRESS = (layout.Status.CREATED, layout.Status.RUNNING)
"""Statuses of a run that may still write steps."""


def poll_anomalies(run_dir: str | os.PathLike[str], rules: AnomalyRules | None = None) -> tuple[pd.DataFrame, str]:
    """The anomalies in what the store at ``run_dir`` holds now, and the run's status read just before."""
    # the status first: if the run had ended by then, every step it wrote is on disk and read below
    status = open_run(run_dir).status
    run = open_run(run_dir)
    try:
        records = run.records_or_none()  # None: scalars only
    except DamagedStoreError:
        records = None  # site arrays unreadable at this moment: judged from the scalars this time
    return find_anomalies(run.scalars, records, rules, scalars_logged=run.logs_scalars), status


def watch_anomalies(run_dir: str | os.PathLike[str], *, rules: AnomalyRules | None = None,
                    interval_s: float = 5.0, on_new: Callable[[pd.Series], None] | None = None,
                    stop_when_finished: bool = True, timeout_s: float | None = None) -> pd.DataFrame:
    """Poll the run at ``run_dir`` as the module docstring describes, calling ``on_new`` with each
    new anomaly (a row of the ``find_anomalies`` table) in step order; returns the last table.
    With ``stop_when_finished=False`` the watch goes on after the run ends, until ``timeout_s``."""
    if not interval_s > 0:
        raise ArgumentError(f"interval_s = {interval_s!r} is not allowed: a number of seconds > 0")
    if timeout_s is not None and not timeout_s >= 0:
        raise ArgumentError(f"timeout_s = {timeout_s!r} is not allowed: a number of seconds >= 0, or None")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    reported: set[tuple[int, str, str]] = set()
    while True:
        found, status = poll_anomalies(run_dir, rules)
        for _, row in found.iterrows():
            key = (int(row["step"]), str(row["rule"]), str(row["site"]))
            if key not in reported:
                reported.add(key)
                if on_new is not None:
                    on_new(row)
        if stop_when_finished and status not in IN_PROGRESS:
            return found
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return found
        time.sleep(interval_s if left is None else min(interval_s, left))

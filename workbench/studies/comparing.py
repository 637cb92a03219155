"""Comparing two run stores: the one way the command line, the workspace and the report compare runs.

    result = compare_stores(open_run(A), open_run(B))               # what ``workbench compare`` prints
    result = compare_stores(a, b, cells=True)                        # a heatmap reads every (step, site) cell
    check = check_resumed_run(open_run(RESUMED), open_run(REF))     # ``workbench resume-check``

Where both stores fold their fingerprints block by block and record the same steps in the same rows, the first
divergence, its origins and the frontier come from the folds (``compare_runs``), and the fingerprints are read only
when ``Comparison.equal`` is asked for; otherwise both runs' records are compared (``analysis.compare.compare``).
What is compared, and what "differ" means, is ``analysis`` (which reads no store); this module reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.analysis.compare import Comparison, RunFacts, both_aligned, check_comparable, compare, origin_sites
from workbench.analysis.resume import ResumeCheck, resume_check
from workbench.store.blocks import block_frontier
from workbench.store.reader import Run, open_run
from workbench.store.records import RunRecords


def compare_stores(a: Run, b: Run, *, cells: bool = False,
                   records: Callable[[Run], RunRecords] | None = None) -> Comparison:
    """``a`` against ``b``: from the stores' folds where both have them (``compare_runs``) and the caller does
    not read every cell (``cells``: a heatmap, which the fingerprints read whole give sooner), else from both
    runs' records (``records``: where to get a run's, default ``Run.records``; a workspace passes the ones it
    holds). ``NoSitesError`` for a run without per-site records."""
    folded = None if cells else compare_runs(a, b)  # None without folds (or without records) in either run
    if folded is not None:
        return folded
    get = records or (lambda run: run.records())
    return compare(get(a), get(b))


def compare_runs(a: Run, b: Run) -> Comparison | None:
    """``compare(a.records(), b.records())`` without reading either run's fingerprints whole, where both stores
    fold them block by block and record the same steps in the same rows: the first divergence and
    the frontier from the folds and the rows of the blocks where a site first differs
    (``store.blocks.block_frontier``), the origins from the first divergent step's row, the statistics lazy;
    the fingerprints are read only when ``Comparison.equal`` is asked for. None where that does not apply
    (then ``compare`` the records)."""
    if not (a.has_bin_fingerprints and b.has_bin_fingerprints):
        return None
    warnings = check_comparable(*(RunFacts(run.name, run.manifest.model.shape() if run.manifest.model else {},
                                            run.status) for run in (a, b)))
    found = block_frontier(a, b)
    steps_a, steps_b = a.recorded_step_numbers(), b.recorded_step_numbers()
    if found is None or not all((np.diff(s) > 0).all() for s in (steps_a, steps_b)):
        return None  # rows that do not line up by step (or a step recorded twice): ``compare`` aligns them
    n, sites, (columns_a, columns_b) = len(found.steps), found.sites, found.columns
    steps = [int(s) for s in found.steps]

    def common_columns(run: Run, columns: np.ndarray, start: int, stop: int) -> np.ndarray:
        rows = run.fingerprint_rows(start, stop)
        return rows if np.array_equal(columns, np.arange(rows.shape[1])) else rows[:, columns]  # no copy: all, in order

    def equal_rows(start: int, stop: int) -> np.ndarray:
        return common_columns(a, columns_a, start, stop) == common_columns(b, columns_b, start, stop)

    def equal_cells() -> pd.DataFrame:
        return pd.DataFrame(equal_rows(0, n), index=pd.Index(steps, name="step"), columns=sites, copy=False)

    origins = []
    if found.first_step is not None:
        row = steps.index(found.first_step)
        origins = origin_sites(pd.Series(equal_rows(row, row + 1)[0], index=sites))
    names_a, names_b = a.site_names(), b.site_names()
    in_a, in_b = set(names_a), set(names_b)
    return Comparison(
        a=a.name, b=b.name, common_steps=steps, common_sites=sites,
        only_in_a={"steps": [int(s) for s in steps_a[n:]], "sites": [s for s in names_a if s not in in_b]},
        only_in_b={"steps": [int(s) for s in steps_b[n:]], "sites": [s for s in names_b if s not in in_a]},
        first_step=found.first_step, first_site=found.first_site, origin_sites=origins, frontier=found.frontier,
        statistics=lambda: both_aligned(a.statistics(), b.statistics(), steps, sites),
        equal_cells=equal_cells, warnings=warnings)


def check_resumed_run(resumed: Run, reference: Run, *, from_step: int | None = None,
                      floor: Run | None = None) -> ResumeCheck:
    """``analysis.resume.resume_check`` of two runs. The floor defaults to the run whose checkpoint ``resumed``
    started from (its manifest's ``started_from``, at another layout) where that folder still exists and is not
    ``reference`` itself: checked against the run it started from, there is no distance to measure a floor by."""
    if floor is None and resumed.manifest.started_from is not None:
        writer = Path(str(resumed.manifest.started_from.get("run")))
        if writer.is_dir() and writer.resolve() != reference.path.resolve():
            floor = open_run(writer)
    return resume_check(resumed.records(), reference.records(), from_step=from_step,
                        floor=floor.records() if floor is not None else None)

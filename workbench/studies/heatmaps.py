"""What the divergence explorer draws, computed and held by the workspace: a pair's step bins (a view of every
step), its matrices of a range of steps, and a clicked cell's snapshots. ``Workspace.step_bins``,
``.heatmap_matrix``, ``.read_pair_ahead`` and ``.snapshot_differences`` forward here; the figures are
``figures.divergence``.

The step bins of a statistic are computed from the two runs' values read and dropped (the full matrix is not
made), once: a view that asks for bins the background is computing waits for them and lets it run. The site the
detail shows keeps its series from the same read, so that the next statistic's detail needs no read.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import nullcontext
from functools import partial
from typing import TYPE_CHECKING

import pandas as pd

from workbench.analysis.elementwise import ElementwiseDifference, elementwise_difference
from workbench.figures.divergence import StepBins, heatmap_matrix
from workbench.store.reader import Run
from workbench.studies.holding import KEPT_MATRICES
from workbench.studies.reading_ahead import Pause

if TYPE_CHECKING:
    from workbench.studies.workspace import Workspace


def step_bins(ws: Workspace, a: str, b: str, stat: str, *, site: str | None = None,
              pause: Pause | None = None) -> StepBins:
    """The step bins of ``stat`` of the pair (kept for each statistic of the pair last asked for; another pair's are
    dropped when a view asks). ``site``: keep that site's series of both runs from the same read. ``pause``: a
    background read's (``ReadAhead``); without it, a view's."""
    if pause is None:  # a view: the bins of the pair it shows stay, another pair's go
        ws.holding.drop("step_bins", unless=lambda key: key[:2] == (a, b))
    waiting = nullcontext if pause is not None else ws.ahead.behind_background

    def compute() -> StepBins:
        values = (ws.peek_stat_values(a, stat, pause=pause), ws.peek_stat_values(b, stat, pause=pause))
        if site is not None:
            ws.keep_site_series(site, stat, {a: values[0], b: values[1]})
        return StepBins.of_values(ws.comparison(a, b), values)

    bins, _ = ws.holding.once("step_bins", (a, b, stat), compute, waiting)
    return bins


def has_step_bins(ws: Workspace, a: str, b: str, stat: str) -> bool:
    return ws.holding.peek("step_bins", (a, b, stat)) is not None


def matrix(ws: Workspace, a: str, b: str, stat: str, steps: tuple[int, int], *, keep: bool = True) -> pd.DataFrame:
    """Site x step matrix of the pair's ``stat`` over ``steps`` (first, last), from those steps' rows alone, read
    and dropped; the latest ``KEPT_MATRICES`` kept (``keep``)."""
    def compute() -> pd.DataFrame:
        values = (ws.peek_stat_values(a, stat, steps), ws.peek_stat_values(b, stat, steps))
        return heatmap_matrix(ws.comparison(a, b), stat, steps=steps, values=values)

    return ws.holding.latest("matrices", (a, b, stat, *steps), compute, kept=KEPT_MATRICES, keep=keep)


def snapshot_differences(a: Run, b: Run, step: int,
                         sites: Iterable[str] | None = None) -> dict[str, ElementwiseDifference]:
    """Element-wise measures of every site both runs snapshotted at ``step`` (what a clicked cell shows beside the
    site's steps)."""
    common = sorted(set(a.snapshots().get(step, [])) & set(b.snapshots().get(step, [])))
    wanted = [s for s in common if sites is None or s in set(sites)]
    return {s: elementwise_difference(a.snapshot(step, s), b.snapshot(step, s), a.snapshot_dtype(step, s))
            for s in wanted}


def read_pair_ahead(ws: Workspace, a: str, b: str, stats: Iterable[str], *, site: str | None = None) -> None:
    """In the background: every statistic of a pair's stores that keep them all in one chunk (read in one pass and
    kept, within the workspace's budget), then the step bins of ``stats``, each with ``site``'s series (a statistic
    read apart is read for them and dropped; a store too large to read in one pass is not read ahead, each of its
    statistics costing that pass)."""
    started = set(ws.preload((a, b)))
    if all(ws.runs[name].reads_statistics_apart or name in started for name in (a, b)):
        ws.read_ahead([partial(_bins_ahead, ws, a, b, stat, site) for stat in stats])


def _bins_ahead(ws: Workspace, a: str, b: str, stat: str, site: str | None, pause: Pause) -> int:
    if has_step_bins(ws, a, b, stat):
        return 0
    bins = step_bins(ws, a, b, stat, site=ws.holding.followed() or site, pause=pause)
    return bins.nbytes

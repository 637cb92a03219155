"""The first divergence and the frontier of two runs read block by block, for stores larger than memory.

    found = block_frontier(open_run(a), open_run(b))   # None where a store has no folds (schema < 3)
    found.first_step, found.first_site, found.frontier  # as analysis.compare gives them

``analysis.compare`` holds both runs' fingerprints in memory (8 bytes per site and recorded step each:
1.6 GB for a pair of 10,000 steps x 10,000 sites). A schema 3 store also folds every block of 64
recorded steps into one number per site (``layout.BIN_FINGERPRINT_ARRAY``), so this reads the folds
(1/64 of that), finds each site's first block whose folds differ, and reads only those blocks' rows:
the memory it needs grows with the sites and the blocks read, not with the steps. A block it reads is
checked against its fold in both stores: a fold that disagrees with the rows it summarises is damage.
Equal folds are taken for equal rows (two differing blocks fold equal only by a 64-bit coincidence).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.errors import DamagedStoreError, IncomparableRunsError
from workbench.statistics import fold_fingerprints
from workbench.store import layout
from workbench.store.reader import Run


@dataclass(frozen=True)
class BlockFrontier:
    first_step: int | None
    first_site: str | None
    frontier: pd.Series
    """First divergent step per site that ever differs, sites in the first run's execution order."""
    steps_compared: int
    blocks_read: int
    """Blocks of rows read (besides the folds), the last partial block included."""
    steps: np.ndarray
    """The step numbers of the rows compared: the first ``steps_compared`` rows of both runs."""
    sites: list[str]
    """The sites both runs recorded, in the first run's execution order."""
    columns: tuple[np.ndarray, np.ndarray]
    """Each run's column of each of ``sites``."""


def block_frontier(a: Run, b: Run) -> BlockFrontier | None:
    """See the module docstring; None where either store has no folds, or their recorded step numbers differ
    over the rows both wrote (then ``analysis.compare`` aligns them)."""
    if not (a.has_bin_fingerprints and b.has_bin_fingerprints):
        return None
    steps_a, steps_b = a.recorded_step_numbers(), b.recorded_step_numbers()
    n = min(len(steps_a), len(steps_b))
    if n == 0 or not np.array_equal(steps_a[:n], steps_b[:n]):
        return None
    names_a, names_b = a.site_names(), b.site_names()
    where_b = {site: j for j, site in enumerate(names_b)}
    common = [i for i, site in enumerate(names_a) if site in where_b]
    if not common:
        raise IncomparableRunsError(f"{a.name} and {b.name} recorded no site in common")
    columns_a = np.array(common)
    columns_b = np.array([where_b[names_a[i]] for i in common])
    size, folds_a = a.bin_fingerprints(n)
    size_b, folds_b = b.bin_fingerprints(n)
    whole = min(len(folds_a), len(folds_b))
    if size != size_b:
        return None
    differs = folds_a[:whole][:, columns_a] != folds_b[:whole][:, columns_b]  # [block, common site]
    first_block = (np.where(differs.any(axis=0), differs.argmax(axis=0), whole) if whole  # ``whole``: the rows
                   else np.zeros(len(common), dtype=np.int64))  # after them; no whole block: all in the partial one
    steps = np.full(len(common), -1, dtype=np.int64)
    blocks = sorted(set(first_block.tolist()) - ({whole} if whole * size >= n else set()))
    for block in blocks:
        start, stop = block * size, min(n, (block + 1) * size)
        rows_a, rows_b = a.fingerprint_rows(start, stop), b.fingerprint_rows(start, stop)
        if block < whole:
            _check_fold(a, block, rows_a, folds_a[block], start)
            _check_fold(b, block, rows_b, folds_b[block], start)
        sites = np.flatnonzero(first_block == block)
        unequal = rows_a[:, columns_a[sites]] != rows_b[:, columns_b[sites]]  # [row, site]
        hit = unequal.any(axis=0)
        steps[sites[hit]] = steps_a[start + unequal.argmax(axis=0)[hit]]
    ever = steps >= 0
    common_sites = [names_a[i] for i in columns_a]
    frontier = pd.Series(steps[ever], index=pd.Index(common_sites)[ever], dtype=int)
    first_step = int(frontier.min()) if not frontier.empty else None
    first_site = None if first_step is None else str(frontier.index[int(np.argmax(frontier.to_numpy() == first_step))])
    return BlockFrontier(first_step, first_site, frontier, n, len(blocks), steps_a[:n], common_sites,
                         (columns_a, columns_b))


def _check_fold(run: Run, block: int, rows: np.ndarray, fold: np.ndarray, start: int) -> None:
    if not np.array_equal(fold_fingerprints(rows, start + np.arange(len(rows))), fold):
        raise DamagedStoreError(f"{run.paths.store}/{layout.SITES_GROUP}/{layout.BIN_FINGERPRINT_ARRAY}: the fold of "
                                f"block {block} disagrees with the fingerprints of its rows {start}-"
                                f"{start + len(rows) - 1}; the store is damaged (rewrite the run)")

"""Which source of nondeterminism matters: one row per source, from the runs that had it alone on.

    table = attribution(ladder.summary, {"splitk": "splitk_gemm", ...}, cost)

For each source: its run against the reference (the ladder's summary row: the first divergent
step and site, where it leaves the noise floor, growth, saturation, plateau and the final
relative difference), whether the first divergent site is where the source acts
(``workbench.determinism.SOURCES``), and the throughput it costs to make that source
deterministic (the source's runs against the runs with every source off, with a bootstrap
interval). On a CPU that cost is the cost of the workbench's emulation, not of a GPU kernel.
Pure pandas: no torch.
"""

from __future__ import annotations

import fnmatch

import numpy as np
import pandas as pd

from workbench.analysis.cost import ThroughputSample, determinism_cost
from workbench.determinism import SOURCES

COLUMNS = ["source", "run", "first_step", "first_site", "where_it_acts", "floor_exit_step", "floor_exit_site",
           "growth", "saturation_step", "plateau", "final_error", "cost_percent", "cost_low", "cost_high"]


def source_label(sources: list[str]) -> str:
    """``a+b`` for a run with several sources on; the source's name for one."""
    return "+".join(sorted(sources))


def acts_where_expected(label: str, site: object) -> bool | None:
    """Whether ``site`` is one the source (or any of several) acts at first; None when nothing is known."""
    patterns = [p for name in label.split("+") if name in SOURCES for p in SOURCES[name].acts_at]
    if not patterns or not isinstance(site, str):
        return None
    return any(fnmatch.fnmatchcase(site, p) for p in patterns)


def source_cost(rates: dict[str, list[np.ndarray]], baseline: list[np.ndarray], *, warmup: int = 2,
                interval: float = 95.0) -> pd.DataFrame:
    """Per source label, the throughput its runs lose against the all-off ``baseline`` runs (a rate per
    step, e.g. tokens/s): ``analysis.cost.determinism_cost``'s columns with ``config`` the source and the
    all-off runs as the deterministic side, so ``tax_percent`` = (median all-off / median with the source
    - 1) x 100 (positive when the source on is the faster: making it deterministic costs that much)."""
    samples = [ThroughputSample(label, True, r) for label in rates for r in baseline]
    samples += [ThroughputSample(label, False, r) for label, runs in rates.items() for r in runs]
    return determinism_cost(samples, warmup=warmup, interval=interval)


def attribution(summary: pd.DataFrame, sources: dict[str, str], cost: pd.DataFrame | None = None) -> pd.DataFrame:
    """``COLUMNS``, one row per run of ``sources`` (run -> source label) found in the ladder ``summary``,
    in the order of ``SOURCES``; ``cost`` is ``source_cost``'s table (cost columns NaN without a row for the
    source)."""
    rows = summary[summary["run"].isin(list(sources))].copy()
    rows.insert(0, "source", rows["run"].map(sources))
    rows["where_it_acts"] = [acts_where_expected(label, site) for label, site in zip(rows["source"],
                                                                                    rows["first_site"], strict=True)]
    if cost is not None and not cost.empty:
        renamed = cost.rename(columns={"config": "source", "tax_percent": "cost_percent", "ci_low": "cost_low",
                                       "ci_high": "cost_high"})
        rows = rows.merge(renamed[["source", "cost_percent", "cost_low", "cost_high"]], on="source", how="left")
    for column in ("cost_percent", "cost_low", "cost_high"):
        if column not in rows:
            rows[column] = np.nan
    order = {name: i for i, name in enumerate(SOURCES)}
    rows["_order"] = [min((order.get(n, len(order)) for n in str(label).split("+")), default=len(order))
                      for label in rows["source"]]
    return rows.sort_values(["_order", "source", "run"], kind="stable")[COLUMNS].reset_index(drop=True)

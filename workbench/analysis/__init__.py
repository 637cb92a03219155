"""Analysis: pure functions over runs' records (pandas / xarray; no torch, no I/O).

    from workbench.analysis import compare, golden_check
    labelled_difference(open_run(a).sites(), open_run(b).sites())   # xarray, step and site coordinates
"""

from workbench.analysis.compare import Comparison, compare
from workbench.analysis.difference import labelled_difference
from workbench.analysis.golden import GoldenCheck, golden_check
from workbench.errors import IncomparableRunsError
from workbench.store.records import RunRecords

__all__ = ["Comparison", "GoldenCheck", "IncomparableRunsError", "RunRecords", "compare", "golden_check",
           "labelled_difference"]

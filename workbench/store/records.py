"""What analysis reads from a run: plain in-memory tables, built by the store layer (no I/O here).

``RunRecords`` holds a run's fingerprints, statistics and site order as pandas / xarray
objects. ``workbench.store.reader.Run.records()`` builds one from a store; tests build
them directly. Analysis functions take ``RunRecords`` and do no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import xarray as xr


@dataclass(frozen=True)
class RunRecords:
    name: str
    fingerprints: pd.DataFrame
    """uint64, index ``step`` (recorded steps), one column per site in execution order."""
    stats: xr.DataArray
    """float64 (step, site, stat)."""
    model: dict[str, Any] = field(default_factory=dict)
    """The model section of the run's config: runs with different shapes cannot be compared."""
    status: str = "complete"
    resumes: tuple[int, ...] = ()
    """Steps from which the run was resumed from a checkpoint (its manifest's ``resumes``)."""
    scalars: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Per-step scalars (loss, grad_norm, ...) indexed by ``step``; empty when not known."""

    @property
    def sites(self) -> list[str]:
        return [str(s) for s in self.fingerprints.columns]

    @property
    def steps(self) -> list[int]:
        return [int(s) for s in self.fingerprints.index]

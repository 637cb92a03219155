"""Synthetic ``RunRecords`` with known answers: random statistics and fingerprints, and a copy of them
perturbed from one step and site on."""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from workbench.analysis import RunRecords
from workbench.statistics import STAT_NAMES

SITES = ["param:embedding.word_embeddings.weight", "param:layers.0.mlp.linear_fc1.weight", "act:embedding",
         "act:layers.0.mlp", "act:layers.0", "loss:cross_entropy", "act_grad:layers.0", "act_grad:embedding",
         "grad:embedding.word_embeddings.weight", "grad:layers.0.mlp.linear_fc1.weight"]


def records(name: str, *, steps: int = 6, sites: list[str] = SITES, seed: int = 0,
            model: dict | None = None) -> RunRecords:
    rng = np.random.default_rng(seed)
    fingerprints = pd.DataFrame(rng.integers(0, 2**63, size=(steps, len(sites)), dtype=np.uint64),
                                index=pd.Index(range(steps), name="step"), columns=sites)
    stats = xr.DataArray(rng.uniform(1, 2, size=(steps, len(sites), len(STAT_NAMES))),
                         dims=("step", "site", "stat"),
                         coords={"step": list(range(steps)), "site": sites, "stat": list(STAT_NAMES)})
    return RunRecords(name=name, fingerprints=fingerprints, stats=stats, model=model or {"num_layers": 1})


def perturb(run: RunRecords, name: str, step: int, site: str, *, factor: float = 1.001,
            later: bool = True) -> RunRecords:
    """A copy of ``run`` whose ``site`` differs from ``step`` on (and everything after it, if ``later``)."""
    fingerprints, stats = run.fingerprints.copy(), run.stats.copy()
    position = fingerprints.columns.get_loc(site)
    for s in fingerprints.index:
        if s < step:
            continue
        columns = fingerprints.columns[position:] if s == step and later else (
            fingerprints.columns if later else [site])
        for column in columns:
            fingerprints.loc[s, column] = np.uint64(int(fingerprints.loc[s, column]) ^ 1)
            stats.loc[{"step": s, "site": column}] = stats.sel(step=s, site=column) * factor
    return RunRecords(name=name, fingerprints=fingerprints, stats=stats, model=run.model)

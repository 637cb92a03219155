"""Precision ladders and layout comparisons: several runs against one reference, per layer.

    result = ladder(reference, [bf16, fp16], floor=noise_floor(repeats))
    result.per_layer      # long table: run, layer, step, relative_error
    result.summary        # one row per run: first divergence, where it leaves the noise floor

A *layer* groups the sites of one transformer layer (``L0``, ``L1`` ...); sites outside
the layers group by their top-level module (``embedding``, ``final_layernorm``,
``output_layer``, ``loss``). A layer's relative error at a step is the median over its
sites of the relative difference of one statistic (the L2 norm by default): the median,
so one tiny bias cannot hide a layer and one large outlier cannot speak for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import xarray as xr

from workbench.analysis.compare import Comparison, compare
from workbench.analysis.growth import amplification, row_nanmedian
from workbench.analysis.noise_floor import FloorCheck, NoiseFloor, leaves_floor
from workbench.sites import SITE_KINDS, layer_label, layer_order, split_site
from workbench.store.records import RunRecords


def sites_in_model_order(sites: list[str]) -> list[str]:
    """Sites grouped by layer (model order), then kind (order within a step), then execution order."""
    layers = layer_order([layer_label(s) for s in sites])
    rank = {label: i for i, label in enumerate(layers)}
    kinds = {kind: i for i, kind in enumerate(SITE_KINDS)}
    position = {site: i for i, site in enumerate(sites)}
    return sorted(sites, key=lambda s: (rank[layer_label(s)], kinds.get(split_site(s)[0], len(kinds)), position[s]))


def per_layer_error(result: Comparison, stat: str = "l2", *, rel: xr.DataArray | None = None) -> pd.DataFrame:
    """step x layer (model order): median over each layer's sites of the relative difference of ``stat``
    (``rel``, where the caller holds it)."""
    rel = (result.relative(stat) if rel is None else rel).transpose("step", "site")
    values = rel.to_numpy()
    labels = np.array([layer_label(str(s)) for s in rel["site"].to_numpy()])
    order = layer_order(sorted(set(labels.tolist())))
    grouped = np.argsort([order.index(label) for label in labels], kind="stable")  # sites layer by layer
    ends = np.cumsum([int((labels == label).sum()) for label in order])
    medians = np.empty((values.shape[0], len(order)))  # [step, layer]
    rows = max(1, _BLOCK // max(values.shape[1], 1))
    for low in range(0, values.shape[0], rows):  # a block of steps' sites gathered once, in layer order
        block = values[low:low + rows][:, grouped]
        for j, (start, end) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
            medians[low:low + rows, j] = row_nanmedian(block[:, start:end])
    return pd.DataFrame(medians, index=pd.Index(rel["step"].to_numpy(), name="step"),
                        columns=pd.Index(order, name="layer"))


_BLOCK = 1 << 18
"""Values per block of steps of ``per_layer_error``."""


@dataclass(frozen=True)
class Ladder:
    reference: str
    stat: str
    per_layer: pd.DataFrame
    """Long table: run, layer, step, relative_error (median over the layer's sites)."""
    summary: pd.DataFrame
    """One row per run: identical, first_step, first_site, floor_exit_step, floor_exit_site,
    floor_exit_layer (NA without a noise floor or when the run stays inside), growth (fitted
    growth of the difference in log10 per step after the first divergence), final_error
    (median over sites of the relative error at the last common step)."""

    def final_by_layer(self) -> pd.DataFrame:
        """run x layer: relative error at the last common step, layers in model order."""
        last = self.per_layer[self.per_layer["step"] == self.per_layer.groupby("run")["step"].transform("max")]
        table = last.pivot(index="run", columns="layer", values="relative_error")
        return table[layer_order([str(c) for c in table.columns])]


def ladder(reference: RunRecords, others: list[RunRecords], *, floor: NoiseFloor | None = None,
           stat: str = "l2", comparisons: list[Comparison] | None = None) -> Ladder:
    """Compare every run in ``others`` with ``reference``, per layer (see the module docstring);
    ``comparisons``: ``compare(reference, run)`` of each, where the caller has them already."""
    results = comparisons if comparisons is not None else [compare(reference, run) for run in others]
    exits = {run.name: leaves_floor(run, floor) for run in others} if floor is not None else {}
    return ladder_of(reference.name, results, stat=stat, floor_checks=exits)


def ladder_of(reference: str, comparisons: list[Comparison], *, stat: str = "l2",
              floor_checks: dict[str, FloorCheck] | None = None,
              relatives: Mapping[str, xr.DataArray] | None = None) -> Ladder:
    """``ladder`` from the comparisons of ``reference`` with each run (``Comparison.b``) and, per run, whether
    it leaves the noise floor (``noise_floor.leaves_floor``; none given: no floor): no run's records needed.
    ``relatives``: per run, the relative difference of ``stat`` where the caller holds it (else computed)."""
    frames, rows = [], []
    for result in comparisons:
        name = result.b
        rel = relatives[name] if relatives is not None and name in relatives else result.relative(stat)
        long = per_layer_error(result, stat, rel=rel).stack().rename("relative_error").reset_index()
        long.insert(0, "run", name)
        frames.append(long)
        exit_step = exit_site = exit_layer = None
        check = (floor_checks or {}).get(name)
        if check is not None and not check.inside:
            exit_step, exit_site = check.first_step, check.first_site
            exit_layer = layer_label(str(exit_site))
        last = rel.isel(step=-1).to_numpy().astype(float)
        growth = amplification(result, stat, rel=rel)
        rows.append({"run": name, "identical": result.identical, "first_step": result.first_step,
                     "first_site": result.first_site, "floor_exit_step": exit_step, "floor_exit_site": exit_site,
                     "floor_exit_layer": exit_layer, "growth": growth.rate,
                     "saturation_step": growth.saturation_step, "plateau": growth.plateau,
                     "final_error": float(np.nanmedian(last)) if np.isfinite(last).any() else float("nan")})
    per_layer_all = (pd.concat(frames, ignore_index=True) if frames
                     else pd.DataFrame(columns=["run", "layer", "step", "relative_error"]))
    summary = pd.DataFrame(rows, columns=["run", "identical", "first_step", "first_site", "floor_exit_step",
                                          "floor_exit_site", "floor_exit_layer", "growth", "saturation_step", "plateau",
                                          "final_error"])
    return Ladder(reference, stat, per_layer_all,
                  summary.astype({"first_step": "Int64", "floor_exit_step": "Int64", "saturation_step": "Int64"}))

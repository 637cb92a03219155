"""Comparing two runs: where they first differ (step, then site in execution order) and how.

    result = compare(a, b)          # a, b: RunRecords
    result.identical, result.first_step, result.first_site, result.origin_sites, result.frontier

The runs are aligned on their common recorded steps and sites first; what one run has and
the other lacks is reported, not silently dropped. A (step, site) is *equal* when the two
fingerprints are equal, which (see ``workbench.statistics``) means bitwise equal tensors.

Origins: at the first divergent step, the first divergent site in execution order is
where the difference appeared. Further down the order a divergent site usually inherits
the difference; it is counted as another origin when its inputs were equal: for the
optimizer's sites (``exp_avg``, ``exp_avg_sq``, ``update`` of a parameter) the gradient
and value of that parameter; for a reduced gradient its local gradient when recorded;
otherwise the previous site of the same kind (the previous activation for an
activation). This is a rule over the recorded sites, not a dataflow graph: two gradients
reduced independently in a different order both count only if an equal gradient lies
between them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from workbench.analysis.difference import FirstHit, first_true, relative_difference
from workbench.analysis.growth import amplification
from workbench.errors import IncomparableRunsError
from workbench.sites import KINDS, site_id, split_site
from workbench.store.records import RunRecords


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    common_steps: list[int]
    common_sites: list[str]
    only_in_a: dict[str, list[Any]]
    """Steps and sites that only run ``a`` recorded (keys ``steps``, ``sites``)."""
    only_in_b: dict[str, list[Any]]
    first_step: int | None
    first_site: str | None
    origin_sites: list[str]
    frontier: pd.Series
    """Per site, the first step at which it differs (sites that never differ are absent)."""
    statistics: Callable[[], tuple[xr.DataArray, xr.DataArray]] = field(repr=False, compare=False)
    """What gives both runs' statistics (step, site, stat) on the common steps and sites, as lazy as the runs'
    are (called when ``relative_difference`` is first asked for)."""
    equal_cells: Callable[[], pd.DataFrame] = field(repr=False, compare=False)
    """What makes ``equal`` (called once, when it is first asked for)."""
    warnings: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.first_step is None

    @cached_property
    def equal(self) -> pd.DataFrame:
        """bool (step x site): fingerprints equal. A comparison from the stores' folds
        (``studies.comparing.compare_runs``) reads the fingerprints for it only now."""
        return self.equal_cells()

    @cached_property
    def relative_difference(self) -> xr.DataArray:
        """|a - b| / max(|a|, |b|) per (step, site, stat); 0 where both are equal, NaN where undefined. Lazy when
        the runs' statistics are; built when first asked for (its graph alone is not free at 10k x 1k)."""
        return relative_difference(*self.statistics())

    def first_difference(self, steps: list[int] | None = None) -> FirstHit | None:
        """The first (step, site) where the runs differ among ``steps`` (default: every common step)."""
        return first_true(~(self.equal if steps is None else self.equal.loc[steps]))

    def relative(self, stat: str, values: tuple[xr.DataArray, xr.DataArray] | None = None) -> xr.DataArray:
        """``relative_difference`` of one statistic (step x site), computed into memory now (a comparison keeps
        nothing: whoever wants it again holds it, as ``Workspace.relative_difference`` does). ``values``: the two
        runs' (step, site) values of ``stat`` where the caller holds them already."""
        if values is not None:
            x, y = (_aligned_stats(v, self.common_steps, self.common_sites) for v in values)
            return relative_difference(x, y).load()
        return self.relative_difference.sel(stat=stat).load()

    def largest_differences(self, stat: str = "l2", count: int = 5, *, rel: xr.DataArray | None = None) -> pd.Series:
        """The ``count`` sites with the largest relative difference of ``stat`` at the last common step (``rel``:
        that relative difference, where the caller holds it)."""
        last = (self.relative(stat) if rel is None else rel).isel(step=-1).to_series()
        return last.dropna().sort_values(ascending=False).head(count)

    def summary(self, *, escape: Callable[[str], str] = str) -> str:
        """What ``workbench compare`` prints: the common steps and sites, the first divergence, its origins, how
        fast the gap grows and the largest differences; run and site names pass through ``escape``."""
        a, b = escape(self.a), escape(self.b)
        lines = [f"warning: {escape(warning)}" for warning in self.warnings]
        lines.append(f"{a} vs {b}: {len(self.common_steps)} common recorded steps, {len(self.common_sites)} common "
                     "sites")
        for label, only in (("only in " + a, self.only_in_a), ("only in " + b, self.only_in_b)):
            if only["steps"] or only["sites"]:
                lines.append(f"  {label}: {len(only['steps'])} steps, {len(only['sites'])} sites (not compared)")
        if self.identical:
            return "\n".join([*lines, "bitwise identical at every common step and site"])
        lines += [f"first divergent step: {self.first_step}", f"first divergent site: {escape(str(self.first_site))}",
                  f"origin sites at that step: {escape(', '.join(self.origin_sites))}",
                  f"sites that ever differ: {len(self.frontier)} of {len(self.common_sites)}"]
        rel = self.relative("l2")
        growth = amplification(self, "l2", rel=rel)
        if growth.rate == growth.rate:  # not NaN: at least two steps with a difference
            lines.append(f"growth of the relative L2 difference after step {self.first_step}: {growth.rate:+.3f} "
                         f"decades per step (median over sites: {growth.overall.loc[self.first_step]:.2e} at step "
                         f"{self.first_step}, {growth.overall.iloc[-1]:.2e} at step {self.common_steps[-1]})")
            if growth.saturation_step is not None:
                lines.append(f"saturates at step {growth.saturation_step}, at {growth.plateau:.2e}")
        lines.append("largest relative differences of the L2 norm at the last common step:")
        lines += [f"  {value:10.3e}  {escape(site)}" for site, value in self.largest_differences(rel=rel).items()]
        return "\n".join(lines)

    def to_dict(self, *, growth: bool = False) -> dict[str, Any]:
        """The result as JSON-ready data; with ``growth``, also how fast the gap grows (``growth.amplification``:
        decades per step, the step it saturates at and its plateau; None where undefined)."""
        rel = self.relative("l2")
        out = {
            "a": self.a,
            "b": self.b,
            "identical": self.identical,
            "first_step": self.first_step,
            "first_site": self.first_site,
            "origin_sites": self.origin_sites,
            "common_steps": self.common_steps,
            "common_sites": self.common_sites,
            "only_in_a": self.only_in_a,
            "only_in_b": self.only_in_b,
            "frontier": {site: int(step) for site, step in self.frontier.items()},
            "largest_differences": {site: float(v) for site, v in self.largest_differences(rel=rel).items()},
            "warnings": self.warnings,
        }
        if growth:
            found = amplification(self, "l2", rel=rel)
            out.update(growth_log10_per_step=_finite_or_none(found.rate), saturation_step=found.saturation_step,
                       plateau=_finite_or_none(found.plateau))
        return out


def _finite_or_none(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


@dataclass(frozen=True)
class RunFacts:
    """What ``check_comparable`` needs of a run."""
    name: str
    model: dict[str, Any]
    status: str


def check_comparable(a: RunRecords | RunFacts, b: RunRecords | RunFacts) -> list[str]:
    """Refuse two runs of different models; the warnings of runs not finished."""
    if a.model and b.model and a.model != b.model:
        changed = sorted(k for k in set(a.model) | set(b.model) if a.model.get(k) != b.model.get(k))
        raise IncomparableRunsError(
            f"{a.name} and {b.name} train different model shapes ({', '.join(f'model.{k}' for k in changed)} "
            "differ); only runs of one model can be compared")
    warnings = []
    for run in (a, b):
        if run.status not in ("complete", "stopped", "diverged"):
            warnings.append(f"{run.name} is {run.status}: only its written steps are compared")
    return warnings


def _inputs(site: str, kind: str, name: str, present: set[str], previous_of_kind: dict[str, str]) -> list[str] | None:
    """The recorded sites ``site`` is computed from, by the rule in the module docstring (None: unknown): the
    sites of the same name its kind is computed from (``sites.KINDS``), else the previous site of its kind."""
    known = KINDS.get(kind)
    inputs = [site_id(k, name) for k in (known.computed_from if known else ()) if site_id(k, name) in present]
    if inputs:
        return inputs
    if known is not None and not known.chained:
        return None
    return [previous_of_kind[kind]] if kind in previous_of_kind else None


def origin_sites(equal_at_step: pd.Series) -> list[str]:
    """Divergent sites at one step where a difference entered, in execution order (see module doc)."""
    present = {str(s) for s in equal_at_step.index}
    equal = {str(s): bool(v) for s, v in equal_at_step.items()}
    origins: list[str] = []
    previous_of_kind: dict[str, str] = {}
    any_divergent = False
    for site, is_equal in equal.items():
        kind, name = split_site(site)
        if not is_equal:
            inputs = _inputs(site, kind, name, present, previous_of_kind)
            # With no known input, a site inherits from whatever ran before it.
            fresh = all(equal[i] for i in inputs) if inputs is not None else not any_divergent
            if fresh:
                origins.append(site)
            any_divergent = True
        previous_of_kind[kind] = site
    return origins


def compare(a: RunRecords, b: RunRecords) -> Comparison:
    """Align two runs and locate their first difference (see the module docstring).

    Equality, the first divergence and the frontier come from the fingerprints alone
    (numpy, in memory); the relative differences of the statistics stay as lazy as the
    runs' statistics are (``Run.records()`` gives Dask-backed arrays), so a comparison of
    stores larger than memory computes only what is asked of it.
    """
    warnings = check_comparable(a, b)
    steps = sorted(set(a.steps) & set(b.steps))
    in_b = set(b.sites)
    sites = [s for s in a.sites if s in in_b]  # a's execution order
    if not steps:
        raise IncomparableRunsError(f"{a.name} and {b.name} have no recorded step in common "
                                    f"({a.name}: {_span(a.steps)}, {b.name}: {_span(b.steps)})")
    if not sites:
        raise IncomparableRunsError(f"{a.name} and {b.name} recorded no site in common; "
                                    "record the same kinds and sites in both")
    equal_values = _aligned(a.fingerprints, steps, sites) == _aligned(b.fingerprints, steps, sites)  # [step, site]
    equal = pd.DataFrame(equal_values, index=pd.Index(steps, name="step"), columns=sites, copy=False)
    differs = ~equal_values
    first = first_true(pd.DataFrame(differs, index=equal.index, columns=sites, copy=False))
    ever = differs.any(axis=0)
    frontier = pd.Series(np.asarray(steps)[differs.argmax(axis=0)[ever]], index=pd.Index(sites)[ever], dtype=int)
    only_sites_a = [s for s in a.sites if s not in in_b]
    in_a = set(a.sites)
    return Comparison(
        a=a.name, b=b.name, common_steps=steps, common_sites=sites,
        only_in_a={"steps": sorted(set(a.steps) - set(steps)), "sites": only_sites_a},
        only_in_b={"steps": sorted(set(b.steps) - set(steps)), "sites": [s for s in b.sites if s not in in_a]},
        first_step=None if first is None else first.step, first_site=None if first is None else first.site,
        origin_sites=[] if first is None else origin_sites(equal.loc[first.step]), frontier=frontier,
        statistics=partial(both_aligned, a.stats, b.stats, steps, sites),  # holds no fingerprints
        equal_cells=lambda: equal, warnings=warnings)


def _aligned(frame: pd.DataFrame, steps: list[int], sites: list[str]) -> np.ndarray:
    """``frame``'s values on ``steps`` x ``sites``, without a copy when they are already in that order."""
    if list(frame.index) == steps and list(frame.columns) == sites:
        return frame.to_numpy()
    return frame.loc[steps, sites].to_numpy()


def both_aligned(a: xr.DataArray, b: xr.DataArray, steps: list[int],
                  sites: list[str]) -> tuple[xr.DataArray, xr.DataArray]:
    return _aligned_stats(a, steps, sites), _aligned_stats(b, steps, sites)


def _aligned_stats(stats: xr.DataArray, steps: list[int], sites: list[str]) -> xr.DataArray:
    if stats.sizes["step"] == len(steps) and stats.sizes["site"] == len(sites) and \
            stats["step"].to_numpy().tolist() == steps and stats["site"].to_numpy().tolist() == sites:
        return stats  # no fancy indexing: keeps a lazy array's chunks as they are
    return stats.sel(step=steps, site=sites)


def _span(steps: list[int]) -> str:
    return f"steps {steps[0]}..{steps[-1]}" if steps else "no steps"

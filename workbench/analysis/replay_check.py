"""The replay check: does a replay from a checkpoint reproduce the original run up to step K?

    check = replay_check(original_records, replay_records, original_scalars, replay_scalars,
                         from_step=20, to_step=27, deterministic=True)
    check.reproduced, check.first_step, check.first_site, check.closeness

Pure. The replay ran the original's config from its checkpoint at ``from_step`` through
``to_step`` with every site recorded. It *reproduces* the original when, on every step in
[from_step, to_step], the per-step loss and gradient norm are bitwise equal and every site
both runs recorded has an equal fingerprint. Otherwise the first departure is named (step,
then site in execution order). A nondeterministic run cannot be expected to reproduce;
``closeness`` says how far the replay stayed from it: per step, the loss's relative
difference and the largest relative difference of a site's L2 norm (NaN when a site is NaN
in one run only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.compare import compare
from workbench.analysis.difference import first_true, relative
from workbench.errors import IncomparableRunsError
from workbench.store.records import RunRecords

SCALARS = ("loss", "grad_norm")
"""Per-step scalars that must be bitwise equal (step time and throughput are not numerics)."""


@dataclass(frozen=True)
class ReplayCheck:
    original: str
    replay: str
    deterministic: bool
    from_step: int
    to_step: int
    steps: list[int]
    """Steps in [from_step, to_step] that both runs completed."""
    sites: int
    """Sites both recorded (the original may record fewer than the replay's every site)."""
    first_step: int | None
    first_site: str | None
    """The first site (execution order) whose fingerprint differs at ``first_step``; a scalar name
    (``loss``, ``grad_norm``) when only the scalars differ there."""
    closeness: pd.DataFrame
    """Per step: ``loss_rel`` and ``max_site_rel`` (largest relative difference of a site's L2 norm)."""
    sites_not_compared: str | None = None
    """Why no site was compared (then only the scalars were), or None when sites were."""

    @property
    def reproduced(self) -> bool:
        return self.first_step is None and bool(self.steps)

    def summary(self) -> str:
        span = f"steps {self.from_step}..{self.to_step} ({len(self.steps)} steps x {self.sites} sites)"
        head = f"replay {self.replay} of {self.original}, {span}: "
        if self.reproduced and self.sites_not_compared is not None:
            return head + (f"loss and grad norm bitwise identical; no site was compared "
                           f"({self.sites_not_compared}), so only the scalars say the replay reproduces the original")
        if self.reproduced:
            return head + "bitwise identical: the replay reproduces the original"
        if not self.steps:
            return head + "no step in common to compare"
        text = head + f"first departs at step {self.first_step}, {self.first_site}"
        if not self.deterministic:
            worst = self.closeness["max_site_rel"].max()
            text += (f". The run is nondeterministic, so a bitwise replay cannot be expected; largest relative "
                     f"difference of a site's L2 norm over the replay: {worst:.2e}")
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"original": self.original, "replay": self.replay, "deterministic": self.deterministic,
                "from_step": self.from_step, "to_step": self.to_step, "steps": self.steps, "sites": self.sites,
                "reproduced": self.reproduced, "first_step": self.first_step, "first_site": self.first_site,
                "sites_not_compared": self.sites_not_compared,
                "closeness": {int(s): {k: _finite(v) for k, v in row.items()}
                              for s, row in self.closeness.iterrows()},
                "summary": self.summary()}


def _finite(value: Any) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


def _bits(values: pd.Series) -> np.ndarray:
    return values.to_numpy(dtype=np.float64).view(np.uint64)


def replay_check(original: RunRecords | None, replay: RunRecords | None, original_scalars: pd.DataFrame,
                 replay_scalars: pd.DataFrame, *, from_step: int, to_step: int,
                 deterministic: bool) -> ReplayCheck:
    """Compare ``replay`` with ``original`` on [from_step, to_step] (see the module docstring).

    Records may be None for runs that recorded no sites: then only the scalars are compared.
    """
    span = [s for s in original_scalars.index if from_step <= s <= to_step and s in replay_scalars.index]
    steps = sorted(int(s) for s in span)
    scalar_diff = {name: _bits(original_scalars.loc[steps, name]) != _bits(replay_scalars.loc[steps, name])
                   for name in SCALARS if name in original_scalars and name in replay_scalars}
    site_first = None
    sites = 0
    site_rel = pd.Series(np.nan, index=pd.Index(steps, name="step"))
    not_compared: str | None = "a run has no per-site records"
    if original is not None and replay is not None and steps:
        try:
            result = compare(original, replay)
        except IncomparableRunsError as err:
            result, not_compared = None, str(err)
        if result is not None:
            shared = [s for s in result.common_steps if from_step <= s <= to_step]
            not_compared = None if shared else f"the runs recorded no step of {from_step}..{to_step} in common"
            sites = len(result.common_sites)
            if shared:
                site_first = result.first_difference(shared)
                rel = result.relative_difference.sel(step=shared, stat="l2").max(dim="site", skipna=False)
                site_rel.loc[shared] = np.asarray(rel.values, dtype=float)
    # the first step where a site or a scalar differs; at that step a site before a scalar
    scalar_first = first_true(pd.DataFrame(scalar_diff, index=steps, dtype=bool))
    first = site_first if scalar_first is None or (site_first is not None and site_first.step <= scalar_first.step) \
        else scalar_first
    first_step, first_site = (first.step, first.site) if first is not None else (None, None)
    loss_rel = relative(original_scalars.loc[steps, "loss"].to_numpy(dtype=float),
                        replay_scalars.loc[steps, "loss"].to_numpy(dtype=float))
    closeness = pd.DataFrame({"loss_rel": loss_rel, "max_site_rel": site_rel.to_numpy()},
                             index=pd.Index(steps, name="step"))
    return ReplayCheck(original=original.name if original is not None else "original",
                       replay=replay.name if replay is not None else "replay", deterministic=deterministic,
                       from_step=from_step, to_step=to_step, steps=steps, sites=sites, first_step=first_step,
                       first_site=first_site, closeness=closeness, sites_not_compared=not_compared)

"""Bug or rounding: a run's difference from its reference, held to the rounding the reference itself makes.

A change of layout or precision is never bitwise identical to its reference, so "where they differ" is step 0
almost everywhere. The question is whether it differs by more than another order of the same reductions
would. The reference's *band runs* answer it: runs of the same code and data whose module outputs and their
gradients each carried one rounding's noise (``record(..., perturb="fp32")``, TTrace's method), and
nondeterministic repeats of the reference where there are any.

* **distance** (step x site x quantity): a site's differences on its own scale
  (``tolerance.site_differences``: the mean and the RMS against the RMS, the extremes against the absmax),
  0 where the fingerprints are equal.
* **band** (step x site x quantity): the largest distance of any band run from the reference, at that step or an
  earlier one (rounding grows as training amplifies it; a band that shrank back would call late rounding a
  bug), and never below one unit in the last place of the band's precision.
* **margin**: each band run left out in turn and held to the band of the others; ``HELD_OUT_FACTOR`` times the
  largest ratio found, and never below ``MIN_MARGIN``. The band times the margin is the tolerance.
* **verdict**: within rounding where every cell's distance is within the tolerance; otherwise beyond it at
  the first (step, site) in execution order that is not, by how many tolerances.

    band = rounding_band(reference, [p1, p2, p3])
    verdict = judge(run, reference, band)
    verdict.within, verdict.first_step, verdict.first_site, verdict.first_ratio, verdict.summary()
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.difference import first_true
from workbench.analysis.tolerance import TOLERANCE_QUANTITIES, site_differences
from workbench.errors import IncomparableRunsError
from workbench.sites import KINDS, layer_of, split_site
from workbench.store.records import RunRecords

HELD_OUT_FACTOR = 2.0
"""The margin is this times the largest ratio a band run left out reaches against the others' band: a band of a
few runs is a sample of rounding's spread, not its bound. Measured (``make corpus``, docs/bug-or-rounding.md):
over 8 random bands each of 4, 6 and 8 runs, 10 of 112, 9 of 96 and 9 of 80 held-out and correct runs lay beyond
the left-out ratio alone, reaching 2.4, 1.3 and 1.4 times it; with this factor, 1, 0 and 0 did."""
MIN_MARGIN = 2.0
"""The least margin, where every band run left out lies far inside the others' band."""
MAX_MARGIN = 100.0
"""The largest margin a verdict stands on. Beyond it the band's runs disagree with one another far more than
rounding's usual spread (one took another path: a MoE token routed to another expert), and a tolerance that wide
would pass anything: the verdict is "unresolved". Measured: margins of 4.7 to 12 on the dense corpus; 2,400 on the
demo's MoE study over 30 steps."""
RECOMMENDED_BAND_RUNS = 6
"""Band runs below which a verdict says it stands on few: with 4, one held-out run in 112 lay beyond the band."""
POOLED_KINDS = ("exp_avg", "exp_avg_sq", "update")
"""The optimizer's kinds, held to their mean alone (``POOLED_QUANTITIES``), against a band that is the largest over
all their sites and steps. Adam divides each gradient element by its own size, so an element whose gradient
cancels to nearly 0 (and so carries a large relative rounding error) moves its update by a large part of the
learning rate in one band run and not at all in the next: measured, a layer norm's largest update moved by 1.7e-4
of it in 6 of 15 band runs at one step and by 2e-6 at most in the other 9, and its RMS by 1.7e-5 against 4e-6.
What such an element does to the model shows in the next step's parameters, on their own scale."""
POOLED_QUANTITIES = ("mean",)
ROUTED = (".experts.", "tokens_per_expert")
"""Sites of a MoE layer that routing decides (an expert's tokens, the count of each expert's tokens): rounding flips
a token from one expert to another in one band run and not in the next (measured on the demo's MoE study: a
count's minimum moved by 1 token in 1 of 4 band runs, 85,000 times the others' band), so their band is the largest
of their kind over the whole run."""
UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp8": 2.0 ** -4}
"""Half the gap from 1 to the next number of each precision (fp8: e4m3's)."""


@dataclass(frozen=True)
class RoundingBand:
    reference: str
    runs: list[str]
    """The band runs (perturbed runs and nondeterministic repeats of the reference)."""
    band: np.ndarray
    """float [step, site, quantity] (``tolerance.TOLERANCE_QUANTITIES``): the largest distance of a band run from
    the reference so far."""
    precision: str
    """The rounding the band stands for; the band is at least one unit in its last place (``UNIT_ROUNDOFF``)."""
    steps: list[int]
    sites: list[str]
    """The band's sites in the reference's execution order."""
    margin: float
    calibration: pd.DataFrame
    """Per band run left out (``run``): ``worst``, its largest distance over the others' band."""


@dataclass(frozen=True)
class RoundingVerdict:
    run: str
    reference: str
    band_runs: list[str]
    margin: float
    within: bool
    first_step: int | None
    """The first step with a site beyond the tolerance (None: within)."""
    first_site: str | None
    first_ratio: float
    """Distance over the tolerance at the first site beyond it (inf where the band is 0; nan when within)."""
    worst_ratio: float
    """The largest distance over the tolerance anywhere (<= 1 within)."""
    worst_step: int | None
    worst_site: str | None
    ratio: pd.DataFrame
    """float (step x site): distance over the tolerance (0 where bitwise equal, inf where the band is 0)."""
    parted_rank: int | None = None
    """Where the first site beyond is a replicated tensor whose copies parted: the TP rank whose copy differs
    from rank 0's (the run's ``replicas_parted``); None otherwise."""
    analytic: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    """The cross-check at the first step: each reduced gradient against TTrace's analytic bound
    (``analytic_check``); empty where the runs record no gradient."""

    @property
    def resolved(self) -> bool:
        """Whether the verdict stands: a margin within ``MAX_MARGIN``, or replicas that parted (a bug whatever the
        band)."""
        return self.parted_rank is not None or self.margin <= MAX_MARGIN

    @property
    def words(self) -> str:
        """``within rounding``, ``beyond rounding`` or ``unresolved``."""
        if not self.resolved:
            return "unresolved"
        return "within rounding" if self.within else "beyond rounding"

    def analytic_words(self) -> str:
        """The cross-check in a few words: how many gradients at the first step are beyond the analytic bound."""
        if self.analytic.empty:
            return "no gradients to hold to the analytic bound"
        beyond = int(self.analytic["beyond"].sum())
        return f"analytic bound: {beyond} of {len(self.analytic)} gradients of the first step beyond it"

    def to_dict(self) -> dict[str, object]:
        """The verdict as JSON types (a ratio over a zero band is the string ``"inf"``), without the table."""
        def number(x: float) -> float | str | None:
            return None if math.isnan(x) else "inf" if math.isinf(x) else x

        return {"run": self.run, "reference": self.reference, "verdict": self.words, "within": self.within,
                "resolved": self.resolved, "first_step": self.first_step,
                "first_site": self.first_site, "first_ratio": number(self.first_ratio),
                "worst_ratio": number(self.worst_ratio), "worst_step": self.worst_step, "worst_site": self.worst_site,
                "band_runs": list(self.band_runs), "margin": self.margin, "parted_tp_rank": self.parted_rank,
                "analytic_beyond": [str(site) for site in self.analytic.loc[self.analytic["beyond"], "site"]]
                if not self.analytic.empty else [], "analytic_checked": len(self.analytic)}

    def summary(self) -> str:
        """One line: within rounding, or beyond it and where to look."""
        few = f", {RECOMMENDED_BAND_RUNS} recommended" if len(self.band_runs) < RECOMMENDED_BAND_RUNS else ""
        band = f"band of {len(self.band_runs)} runs{few} x margin {self.margin:.3g}"
        if not self.resolved:
            return (f"{self.run} vs {self.reference}: unresolved: the band's runs disagree with one another up to "
                    f"{self.margin / HELD_OUT_FACTOR:.3g} times the others' band (one took another path: a MoE "
                    f"token routed to another expert, say), and a tolerance that wide passes anything; add band "
                    f"runs, or judge fewer steps ({band}; {self.analytic_words()})")
        if self.within:
            return (f"{self.run} vs {self.reference}: within rounding at every step and site "
                    f"(largest {self.worst_ratio:.3g} of the tolerance; {band}; {self.analytic_words()})")
        if self.parted_rank is not None:
            return (f"{self.run} vs {self.reference}: beyond rounding from step {self.first_step}: look at "
                    f"{self.first_site}, whose copy on TP rank {self.parted_rank} differs from TP rank 0's (replicas "
                    f"of one tensor agree bitwise in a correct run; {band}; {self.analytic_words()})")
        return (f"{self.run} vs {self.reference}: beyond rounding from step {self.first_step}: look at "
                f"{self.first_site} ({_times(self.first_ratio)} the tolerance there; largest "
                f"{_times(self.worst_ratio)} at step {self.worst_step}, {self.worst_site}; {band}; "
                f"{self.analytic_words()})")


def _times(ratio: float) -> str:
    return "infinitely many times (the band is 0 there)" if math.isinf(ratio) else f"{ratio:.3g}x"


def _aligned(runs: list[RunRecords]) -> tuple[list[int], list[str]]:
    steps = sorted(set.intersection(*(set(r.steps) for r in runs)))
    common = set.intersection(*(set(r.sites) for r in runs))
    sites = [s for s in runs[0].sites if s in common]  # the reference's execution order
    if not steps or not sites:
        names = ", ".join(r.name for r in runs)
        raise IncomparableRunsError(f"{names} share no recorded step or site")
    return steps, sites


def distance(run: RunRecords, reference: RunRecords, steps: list[int], sites: list[str]) -> np.ndarray:
    """float [step, site, quantity] (``TOLERANCE_QUANTITIES``): each quantity's difference on the site's own
    scale; 0 where the fingerprints are equal (the statistics of equal tensors can differ in their last bit
    when shards merge in another order)."""
    a = reference.stats.sel(step=steps, site=sites).transpose("step", "site", "stat").to_numpy()
    b = run.stats.sel(step=steps, site=sites).transpose("step", "site", "stat").to_numpy()
    equal = reference.fingerprints.loc[steps, sites].to_numpy() == run.fingerprints.loc[steps, sites].to_numpy()
    judged = np.array([[split_site(site)[0] not in POOLED_KINDS or q in POOLED_QUANTITIES
                        for q in TOLERANCE_QUANTITIES] for site in sites])  # [site, quantity]
    return np.where(equal[..., None] | ~judged, 0.0, site_differences(a, b))


def pool_of(site: str) -> str | None:
    """The pool whose band ``site`` shares over all its sites and steps: the optimizer's kinds (``POOLED_KINDS``)
    and, in a MoE layer, what routing decides (``ROUTED``), by kind; None for a site with a band of its own."""
    kind, name = split_site(site)
    if kind in POOLED_KINDS:
        return kind
    if any(part in name for part in ROUTED):
        return f"{kind}:routed"
    return None


def _envelope(distances: list[np.ndarray], pools: np.ndarray) -> np.ndarray:
    """The largest distance so far [step, site, quantity] of any of ``distances`` (steps in order); at the sites
    of a pool (``pool_of``) the largest of the pool over the whole run."""
    envelope = np.maximum.accumulate(np.max(np.stack(distances), axis=0), axis=0)
    for pool in {p for p in pools.tolist() if p is not None}:
        sites = pools == pool
        envelope[:, sites] = envelope[:, sites].max(axis=(0, 1), keepdims=True)
    return envelope


def _ratio(d: np.ndarray, tolerance: np.ndarray) -> np.ndarray:
    """float [step, site]: the largest quantity's distance over its tolerance (0 where equal, inf where the
    tolerance is 0 and the distance is not)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(d == 0, 0.0, np.where(tolerance > 0, d / np.where(tolerance > 0, tolerance, 1.0), np.inf))
    return ratio.max(axis=-1)


def rounding_band(reference: RunRecords, band_runs: list[RunRecords], *, precision: str = "fp32") -> RoundingBand:
    """The band of ``reference`` from two or more band runs, its margin calibrated by leaving each out.

    ``precision``: the rounding the band stands for (the band runs' ``perturbation``); no band is narrower than
    one unit in the last place of it on the site's scale, since an extreme is one element, and one element
    moves by a whole unit or not at all (an update's largest element keeps its bits in every band run and
    moves by one unit in a correct layout)."""
    if precision not in UNIT_ROUNDOFF:
        raise IncomparableRunsError(f"precision {precision!r}: a rounding band is of {', '.join(UNIT_ROUNDOFF)}")
    if len(band_runs) < 2:
        raise IncomparableRunsError(f"a rounding band needs at least two band runs of {reference.name}, got "
                                    f"{len(band_runs)}: record more with record(..., perturb=PRECISION)")
    steps, sites = _aligned([reference, *band_runs])
    distances = [distance(run, reference, steps, sites) for run in band_runs]
    pools = np.array([pool_of(site) for site in sites], dtype=object)
    quantum = 2 * UNIT_ROUNDOFF[precision]
    rows = []
    for k, run in enumerate(band_runs):
        ratio = _ratio(distances[k], np.maximum(_envelope([d for i, d in enumerate(distances) if i != k], pools),
                                                               quantum))
        rows.append({"run": run.name, "worst": float(ratio.max(initial=0.0))})
    calibration = pd.DataFrame(rows, columns=["run", "worst"])
    return RoundingBand(reference.name, [r.name for r in band_runs], np.maximum(_envelope(distances, pools), quantum),
                        precision, steps, sites,
                        max(MIN_MARGIN, HELD_OUT_FACTOR * float(calibration["worst"].max())), calibration)


def judge(run: RunRecords, reference: RunRecords, band: RoundingBand, *,
          replicas_parted: Mapping[str, Any] | None = None) -> RoundingVerdict:
    """Whether ``run`` differs from ``reference`` by rounding alone (see the module docstring). ``replicas_parted``:
    the run's manifest's (``step``, ``site``, ``tp_rank``), where copies of a replicated tensor first differed
    between TP ranks; they never do in a correct run, so that step and site are beyond rounding, unless a site
    left the band earlier."""
    if band.reference != reference.name:
        raise IncomparableRunsError(f"the band is {band.reference}'s, not {reference.name}'s")
    steps, sites = _aligned([reference, run])
    steps = [s for s in steps if s in set(band.steps)]
    sites = [s for s in sites if s in set(band.sites)]
    if not steps or not sites:
        raise IncomparableRunsError(f"{run.name} shares no recorded step or site with the band of {reference.name}")
    rows = [band.steps.index(s) for s in steps]
    columns = [band.sites.index(s) for s in sites]
    ratio = _ratio(distance(run, reference, steps, sites), band.margin * band.band[np.ix_(rows, columns)])
    frame = pd.DataFrame(ratio, index=pd.Index(steps, name="step"), columns=pd.Index(sites, name="site"))
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    worst_ratio = float(ratio[worst])
    first = first_true(frame > 1.0)
    verdict = RoundingVerdict(
        analytic=analytic_check(run, reference, step=steps[0], precision=band.precision),
        run=run.name, reference=reference.name, band_runs=band.runs, margin=band.margin, within=first is None,
        first_step=None if first is None else first.step, first_site=None if first is None else first.site,
        first_ratio=math.nan if first is None else float(frame.loc[first.step, first.site]),
        worst_ratio=worst_ratio, worst_step=steps[worst[0]] if worst_ratio > 0 else None,
        worst_site=sites[worst[1]] if worst_ratio > 0 else None, ratio=frame)
    if replicas_parted is not None and (first is None or int(replicas_parted["step"]) < first.step or (
            int(replicas_parted["step"]) == first.step and _before(str(replicas_parted["site"]), first.site, sites))):
        return dataclasses.replace(verdict, within=False, first_step=int(replicas_parted["step"]),
                                   first_site=str(replicas_parted["site"]), first_ratio=math.inf,
                                   worst_ratio=math.inf, parted_rank=int(replicas_parted["tp_rank"]))
    return verdict


def _before(site: str, other: str, order: list[str]) -> bool:
    """Whether ``site`` comes before ``other`` in execution order (a site not recorded: by its kind's order)."""
    if site in order and other in order:
        return order.index(site) < order.index(other)
    kinds = list(KINDS)
    return kinds.index(split_site(site)[0]) <= kinds.index(split_site(other)[0])


MACHINE_EPSILON = {"fp32": 2.0 ** -23, "bf16": 2.0 ** -7, "fp16": 2.0 ** -10, "fp8": 2.0 ** -7}
"""Machine epsilon as Megatron-LM's bound takes it (fp8: bf16's, per TTrace's theorem 5.3)."""


def analytic_bound(depth: int, precision: str = "fp32", *, k: float = 4.0, c: float = 1.03) -> float:
    """TTrace's per-layer bound on a gradient's relative Frobenius difference under another reduction order,
    ``k * c ** depth * eps`` (arXiv 2506.09280, theorem 5.3; the constants Megatron-LM's functional tests use):
    ``depth`` counts the layers from the top (the output layer 1, the embedding the deepest)."""
    return float(k * c ** max(depth, 0) * MACHINE_EPSILON[precision])


def analytic_check(run: RunRecords, reference: RunRecords, *, step: int = 0, precision: str = "fp32") -> pd.DataFrame:
    """The cross-check of a verdict: each reduced gradient (``grad``) at ``step`` against ``analytic_bound``. The
    records hold each tensor's norm, not the difference's: ``| ||g|| - ||g_ref|| | / ||g_ref||`` is at most the
    relative difference the bound holds, so a gradient whose norm moves by more is beyond the bound for certain,
    and one whose norm moves by less may or may not be. One row per gradient: site, depth, norm_change, bound,
    beyond."""
    columns = ["site", "depth", "norm_change", "bound", "beyond"]
    steps, sites = _aligned([reference, run])
    grads = [s for s in sites if split_site(s)[0] == "grad"]
    if step not in steps or not grads:
        return pd.DataFrame(columns=columns)
    layers = [layer_of(split_site(s)[1]) for s in grads]
    top = max((layer for layer in layers if layer is not None), default=-1) + 1
    a = reference.stats.sel(step=step, site=grads, stat="l2").to_numpy()
    b = run.stats.sel(step=step, site=grads, stat="l2").to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        change = np.where(a > 0, np.abs(b - a) / np.where(a > 0, a, 1.0), np.where(a == b, 0.0, np.inf))
    rows = []
    for site, layer, moved in zip(grads, layers, change, strict=True):
        name = split_site(site)[1]
        depth = top + 1 if name.startswith("embedding") else top - layer if layer is not None else 1
        bound = analytic_bound(depth, precision)
        rows.append({"site": site, "depth": depth, "norm_change": float(moved), "bound": bound,
                     "beyond": bool(moved > bound)})
    return pd.DataFrame(rows, columns=columns)

"""A reference a run is compared with while it trains: at each flush, the steps just flushed against the
reference's, so that a run that departs at step k is stopped within one flush of k.

    live = LiveReference.of_run(records, run_id=...)    # a reference store: every site's fingerprint
    live = LiveReference.of_golden(golden, rtol=1e-6)   # a golden file: the weights' fingerprint, the scalars
    live.refusal(model=..., steps=[...])                # the reason it cannot serve as a reference, or None
    departure = live.sites(steps, sites, fingerprints, stats)   # rank 0, as a flush lands
    departure = departure or live.scalars(step, row)            # rank 0, as each step's scalars are written

"Departed" means what the check after the run (``analysis.golden``, ``analysis.golden_values``) says
failed, step by step:

* a reference store, bitwise: a site's fingerprint differs (the first such site in the run's execution
  order is named); with ``rtol``: a site's statistics differ beyond the tolerance
  (``analysis.tolerance.site_differences``); the loss and grad norm bitwise, or within ``rtol`` of the
  mean of both trajectories *so far* (the check after the run takes the mean over every checked step);
* a workbench golden file: the fingerprint of all the weights (``weights_fingerprints`` of the ``param``
  sites), and its scalars as above;
* a Megatron-LM golden file: its metrics rounded to 5 decimals, ``numpy.isclose`` with ``rtol``, "nan" as
  infinity; exact without ``rtol``, and with it a metric departs once more of its steps have failed than
  its approximate test lets through over the whole file (``min(max(n // 100, 1), 50)``).

Pure: numpy and pandas, no torch, no file read (``recorder.live.load_reference`` opens the reference); the
recorder (``recorder.live``) feeds it on global rank 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.golden_values import (
    GoldenValues,
    megatron_allowance,
    megatron_close,
    weights_fingerprints,
)
from workbench.analysis.tolerance import TOLERANCE_SCALARS, scalar_differences, site_differences
from workbench.errors import ArgumentError
from workbench.statistics import STAT_NAMES
from workbench.store.records import RunRecords

_UNTIMED = ("step_time", "tokens_per_s", "recorder_time")
"""Scalars that measure the machine's speed: never a departure."""


@dataclass(frozen=True)
class Departure:
    """Where a run first left its reference."""

    step: int
    site: str
    """The first differing site in execution order, or the scalar (``loss``), or ``weights``."""
    detail: str
    reference: str
    """The reference's id: a run id, or a golden file's path."""

    @property
    def on_site(self) -> bool:
        """Whether a recorded site departed (``kind:name``), rather than a scalar or the weights' fingerprint."""
        return ":" in self.site

    def summary(self) -> str:
        return f"departed from {self.reference} at step {self.step}: {self.site}: {self.detail}"

    def verdict(self, run: str, against: str, *, stopped_after: int | None, against_a_run: bool) -> str:
        """What the run's command prints: where it departed, where it stopped, and what to run next (a replay of
        the step from the checkpoint before it; a bisect where the reference is a run, ``against_a_run``)."""
        stop = f"stopped after step {stopped_after}" if stopped_after is not None else "trained on (--keep-going)"
        lines = [f"DIVERGED: {run} {self.summary()}; {stop}",
                 f"  next: workbench replay {run} --step {self.step} --trace"]
        if against_a_run:
            lines.append(f"        workbench bisect {against} {run} --step {self.step}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "site": self.site, "detail": self.detail, "reference": self.reference}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Departure:
        """The departure ``to_dict`` wrote (a manifest's ``diverged``, the broadcast); other keys are ignored."""
        return cls(step=int(data["step"]), site=str(data["site"]), detail=str(data.get("detail", "")),
                   reference=str(data["reference"]))


@dataclass
class LiveReference:
    """What a run is compared with as it trains (see the module docstring); built once, before the first step."""

    reference: str
    """Its id, named in the verdict (a run id, or a golden file's path)."""
    kind: str
    """``store``, ``workbench`` (a workbench golden file) or ``megatron``."""
    rtol: float | None = None
    model: Mapping[str, Any] | None = None
    """The reference's model shape (``ModelSignature.shape``), where known."""
    steps: list[int] = field(default_factory=list)
    """The steps the reference recorded sites (a store) or values (a golden file) at."""
    site_names: list[str] = field(default_factory=list)
    records: RunRecords | None = None
    golden: GoldenValues | None = None
    _scalars: dict[int, Mapping[str, float]] = field(default_factory=dict)
    _failures: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rtol is not None and not self.rtol >= 0:
            raise ArgumentError(f"rtol = {self.rtol!r} is not allowed: a number >= 0")
        self._step_set, self._site_set = set(self.steps), set(self.site_names)

    # -- building --------------------------------------------------------------------------

    @classmethod
    def of_run(cls, records: RunRecords, *, run_id: str, rtol: float | None = None) -> LiveReference:
        """A reference store's records (read lazily: a flush reads its own steps of the reference)."""
        return cls(reference=run_id, kind="store", rtol=rtol, model=dict(records.model) or None,
                   steps=list(records.steps), site_names=list(records.sites), records=records)

    @classmethod
    def of_golden(cls, golden: GoldenValues, *, rtol: float | None = None) -> LiveReference:
        steps = sorted(int(s) for s in golden.scalars.index)
        if golden.weights is not None:
            steps = sorted(set(steps) | {int(s) for s in golden.weights.index})
        return cls(reference=golden.source, kind=golden.format, rtol=rtol, steps=steps, golden=golden)

    def refusal(self, *, model: Mapping[str, Any] | None, steps: Sequence[int],
                recorded: Sequence[int] | None = None, sites: Sequence[str] | None = None) -> str | None:
        """Why this reference cannot serve a run of ``model`` training ``steps`` (recording sites at
        ``recorded``: default every step; ``sites`` where already known), or None: refused before the first
        step rather than failing later."""
        if self.model is not None and model is not None and dict(self.model) != dict(model):
            theirs = ", ".join(f"{k}={v}" for k, v in self.model.items() if dict(model).get(k) != v)
            return f"{self.reference} is a run of another model ({theirs})"
        if self.kind == "megatron":
            return None  # its metrics have steps of their own: the check compares the steps the file has
        needed = list(recorded if recorded is not None else steps) if self.kind == "store" else list(steps)
        uncovered = [s for s in needed if s not in self._step_set]
        if self.kind == "store" and self.records is not None and not self.site_names:
            return f"{self.reference} has no per-site records to compare with"
        if uncovered:
            return (f"{self.reference} recorded {len(self.steps)} steps (up to {max(self.steps, default=-1)}); "
                    f"the run would record {len(uncovered)} it lacks, from step {uncovered[0]}")
        if sites is not None:
            missing = [s for s in sites if s not in self._site_set]
            if missing and self.kind == "store":
                return f"{self.reference} did not record {len(missing)} of the run's sites, {missing[0]} first"
        return None

    # -- checking ----------------------------------------------------------------------------

    def sites(self, steps: Sequence[int], sites: Sequence[str], fingerprints: np.ndarray,
              stats: np.ndarray | None = None) -> Departure | None:
        """The first departure among the flushed ``steps`` (fingerprints [step, site] uint64 and, for a
        tolerance, stats [step, site, stat] in ``STAT_NAMES`` order, columns in ``sites``' order: the run's
        execution order), or None."""
        if self.kind == "store":
            return self._store_sites(list(steps), list(sites), fingerprints, stats)
        golden = self.golden
        if golden is None or golden.weights is None or self.rtol is not None:
            return None  # a fingerprint has no tolerance: with rtol the weights are not checked
        params = [i for i, s in enumerate(sites) if s.startswith("param:")]
        if not params:
            return None
        table = pd.DataFrame(fingerprints[:, params], index=list(steps), columns=[sites[i] for i in params])
        for step, got in weights_fingerprints(table).items():
            expected = golden.weights.get(step)
            if expected is not None and got != expected:
                return Departure(int(step), "weights", f"fingerprint {got} != {expected}", self.reference)
        return None

    def _store_sites(self, steps: list[int], sites: list[str], fingerprints: np.ndarray,
                     stats: np.ndarray | None) -> Departure | None:
        assert self.records is not None
        rows = [i for i, s in enumerate(steps) if s in self._step_set]
        if not rows:
            return None
        known = [steps[i] for i in rows]
        columns = [j for j, s in enumerate(sites) if s in self._site_set]
        common = [sites[j] for j in columns]
        if self.rtol is None:
            theirs = self.records.fingerprints.loc[known, common].to_numpy(dtype=np.uint64)
            differs = fingerprints[np.ix_(rows, columns)] != theirs
            details = None
        else:
            if stats is None:
                raise ArgumentError("a tolerance needs the flushed statistics")
            ref = np.asarray(self.records.stats.sel(step=known, site=common, stat=list(STAT_NAMES))
                             .transpose("step", "site", "stat").to_numpy(), dtype=float)
            normalised = site_differences(stats[np.ix_(rows, columns)], ref).max(axis=2)
            differs = normalised > self.rtol
            details = normalised
        for i, step in enumerate(known):
            where = np.flatnonzero(differs[i])
            if where.size:
                j = int(where[0])
                detail = "fingerprint differs" if details is None else \
                    f"differs by {details[i, j]:.3g} of its scale (rtol {self.rtol:g})"
                return Departure(step, common[j], detail, self.reference)
        return None

    def scalars(self, step: int, row: Mapping[str, float]) -> Departure | None:
        """The departure of one step's scalars (loss, grad norm, ...: the reference's that are not timings), or
        None. Called for every step, in order."""
        self._scalars[step] = row
        if self.kind == "megatron":
            return self._megatron(step, row)
        theirs = self.records.scalars if self.records is not None else \
            (self.golden.scalars if self.golden is not None else pd.DataFrame())
        if step not in theirs.index:
            return None
        names = [n for n in (TOLERANCE_SCALARS if self.kind == "store" else theirs.columns)
                 if n in theirs and n in row and n not in _UNTIMED]
        for name in names:
            expected, got = float(theirs.at[step, name]), float(row[name])
            if not (math.isfinite(expected) or math.isnan(expected)):
                continue
            if self.rtol is None:
                same = np.float64(got).view(np.uint64) == np.float64(expected).view(np.uint64) or \
                    (math.isnan(got) and math.isnan(expected))
                if not same:
                    return Departure(step, name, f"{got!r} != {expected!r} (bitwise)", self.reference)
                continue
            so_far = [s for s in sorted(self._scalars) if s in theirs.index and name in self._scalars[s]]
            a = np.array([self._scalars[s][name] for s in so_far], dtype=float)
            b = theirs.loc[so_far, name].to_numpy(dtype=float)
            normalised = scalar_differences(a, b)[-1]
            if normalised > self.rtol:
                return Departure(step, name, f"differs by {normalised:.3g} of its mean ({got:.6g} vs "
                                 f"{expected:.6g})", self.reference)
        return None

    def _megatron(self, step: int, row: Mapping[str, float]) -> Departure | None:
        golden = self.golden
        assert golden is not None
        for name in golden.scalars.columns:
            if name in _UNTIMED or name not in row:
                continue
            expected = golden.scalars[name].dropna()
            if step not in expected.index:
                continue
            actual, ref, close = megatron_close(np.array([row[name]]), np.array([expected.loc[step]]), self.rtol)
            if close[0]:
                continue
            allowed = megatron_allowance(len(expected), self.rtol)
            self._failures[name] = self._failures.get(name, 0) + 1
            if self._failures[name] > allowed:
                extra = f" ({self._failures[name]} steps failed, {allowed} allowed)" if allowed else ""
                return Departure(step, name, f"{float(actual[0])!r} vs {float(ref[0])!r}{extra}", self.reference)
        return None

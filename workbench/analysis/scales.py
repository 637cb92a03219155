"""Does a difference matter? One run's change judged against two scales, not one.

A precision or layout change that moves the final loss by 3e-4 means nothing if two
nondeterministic repeats of one configuration already end 5e-4 apart (the *noise floor*),
and little if two initialisations (seeds) end 2e-2 apart (the *seed-to-seed spread*): a
change inside the seed spread is one a researcher would not see across seeds either.

    judge_against_scales(final, reference="det-r0", floor_runs=[...], seed_runs=[...])

``final`` holds one value per run (the last held-out validation loss, say). The scale of a
group is its range (largest minus smallest); a run's difference is taken from the
reference's value. A difference and a floor both within ``LAST_PLACES`` units of the value's last place are
``unresolved``: at that resolution the value cannot say. Pure: numbers in, a table out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from enum import StrEnum

import numpy as np
import pandas as pd


class ScaleVerdict(StrEnum):
    """Where a run's difference from the reference lies against the two scales."""

    WITHIN_FLOOR = "within the noise floor"
    WITHIN_SEEDS = "beyond the noise floor, within the seed spread"
    BEYOND_SEEDS = "beyond the seed spread"
    BEYOND_FLOOR = "beyond the noise floor (no seed runs to judge against)"
    NO_SCALE = "no noise floor or seed runs to judge against"
    UNRESOLVED = "unresolved: the difference and the noise floor are within a few units of the value's last place"


LAST_PLACES = 4
"""Units in the last place of a float32 value (a loss as the training logged it) within which a difference, and a
noise floor, cannot be told apart: short fp32 runs end 0 or 2.4e-7 apart, and one sweep called a correct change
"within the noise floor" and the next "beyond" it. ``workbench verdict`` judges such runs site by site instead."""


def spread(values: Iterable[float]) -> float:
    """The range of the finite values (NaN for fewer than two)."""
    finite = [v for v in values if math.isfinite(v)]
    return max(finite) - min(finite) if len(finite) >= 2 else math.nan


def judge_against_scales(final: Mapping[str, float], *, reference: str, runs: Iterable[str],
                         floor_runs: Iterable[str], seed_runs: Iterable[str]) -> pd.DataFrame:
    """Per run of ``runs``: its value, its difference from the reference, the two scales and a verdict."""
    floor = spread(final[n] for n in floor_runs if n in final)
    seeds = spread(final[n] for n in seed_runs if n in final)
    rows = []
    for name in runs:
        difference = abs(final[name] - final[reference])
        resolution = LAST_PLACES * float(np.spacing(np.float32(abs(final[reference])))) \
            if math.isfinite(final[reference]) else math.nan
        if 0 < difference <= resolution and not floor > resolution:
            verdict = ScaleVerdict.UNRESOLVED
        elif math.isfinite(floor) and difference <= floor:
            verdict = ScaleVerdict.WITHIN_FLOOR
        elif math.isfinite(seeds):
            verdict = ScaleVerdict.WITHIN_SEEDS if difference <= seeds else ScaleVerdict.BEYOND_SEEDS
        else:
            verdict = ScaleVerdict.BEYOND_FLOOR if math.isfinite(floor) else ScaleVerdict.NO_SCALE
        rows.append({"run": name, "value": final[name], "difference": difference, "noise_floor": floor,
                     "seed_spread": seeds, "verdict": verdict})
    return pd.DataFrame(rows, columns=["run", "value", "difference", "noise_floor", "seed_spread", "verdict"])

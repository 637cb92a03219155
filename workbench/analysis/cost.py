"""What deterministic mode costs in throughput, per configuration, with a bootstrap interval.

Each run contributes its per-step tokens per second (recorder time already excluded by
the runner) after a warm-up. Per configuration the tax is

    tax % = (median default tokens/s / median deterministic tokens/s - 1) x 100

positive when deterministic mode is slower. The interval (95 % by default) comes from
resampling the steps of each side with replacement. Any rate works in place of tokens per
second (``Workspace.cost`` also measures steps per second, from the step time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.errors import ArgumentError

COLUMNS = ["config", "deterministic_tokens_per_s", "default_tokens_per_s", "tax_percent", "ci_low", "ci_high",
           "steps_deterministic", "steps_default"]


@dataclass(frozen=True)
class ThroughputSample:
    config: str
    """The configuration apart from the determinism switch (a summary or a hash)."""
    deterministic: bool
    tokens_per_s: np.ndarray
    """Per step, warm-up included (``warmup`` steps are dropped per run)."""


def _tax(det: np.ndarray, default: np.ndarray) -> float:
    return (float(np.median(default)) / float(np.median(det)) - 1.0) * 100.0


def determinism_cost(samples: list[ThroughputSample], *, warmup: int = 2, resamples: int = 2000,
                     seed: int = 0, interval: float = 95.0) -> pd.DataFrame:
    """One row per configuration that has both deterministic and default runs (``COLUMNS``); the
    bootstrap interval covers ``interval`` percent."""
    if not 0 < interval < 100:
        raise ArgumentError(f"interval = {interval!r}: a percentage between 0 and 100")
    if warmup < 0:
        raise ArgumentError(f"warmup = {warmup!r}: a number of steps >= 0")
    rng = np.random.default_rng(seed)
    rows = []
    for config in sorted({s.config for s in samples}):
        sides = {flag: np.concatenate([s.tokens_per_s[warmup:] for s in samples
                                       if s.config == config and s.deterministic is flag] or [np.empty(0)])
                 for flag in (True, False)}
        det, default = (x[np.isfinite(x)] for x in (sides[True], sides[False]))
        if len(det) == 0 or len(default) == 0:
            continue
        boot = [_tax(rng.choice(det, len(det)), rng.choice(default, len(default))) for _ in range(resamples)]
        low, high = np.percentile(boot, [50 - interval / 2, 50 + interval / 2])
        rows.append([config, float(np.median(det)), float(np.median(default)), _tax(det, default), float(low),
                     float(high), len(det), len(default)])
    return pd.DataFrame(rows, columns=COLUMNS)

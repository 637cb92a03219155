"""Anomalies in one run: the first NaN/Inf, loss spikes, exploding or vanishing gradients, and
parameter updates out of proportion.

    found = find_anomalies(scalars, records)        # a DataFrame, one row per anomaly, by step
    found = find_anomalies(scalars, records, AnomalyRules(spike_factor=4.0))

Pure: the run's per-step scalars (pandas, indexed by step) and optionally its per-site
records in, a table out. Rules:

* ``nonfinite``: the first recorded step where a site holds NaN or Inf, and the first such
  site in execution order (where it appeared, not everything it spread to); a NaN/Inf loss
  or gradient norm without site records is reported from the scalars.
* ``loss_spike``: loss above ``median + spike_factor x MAD`` of the previous ``window`` steps
  (a robust rolling baseline: one earlier spike does not raise the bar).
* ``grad_explode`` / ``grad_vanish``: gradient norm above ``explode_factor`` x or below
  1 / ``vanish_factor`` x its rolling median.
* ``update_ratio``: ||update|| / ||param|| of a parameter outside [``min_update_ratio``,
  ``max_update_ratio``] after ``settle_steps`` (needs ``update`` and ``param`` sites;
  parameters at 0 are skipped).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analysis.difference import first_true
from workbench.errors import ConfigError
from workbench.sites import split_site
from workbench.store.records import RunRecords

COLUMNS = ["step", "rule", "site", "value", "threshold", "detail"]


@dataclass(frozen=True)
class AnomalyRules:
    window: int = 20
    """Steps in the rolling baseline."""
    spike_factor: float = 6.0
    """A loss spike lies this many median absolute deviations above the rolling median."""
    explode_factor: float = 10.0
    vanish_factor: float = 100.0
    settle_steps: int = 3
    """Steps at the start where update ratios are not judged: a zero-initialised bias moves by
    about its own size in its first updates."""
    min_update_ratio: float = 0.0
    """0 turns the lower bound off (a frozen parameter updates by 0)."""
    max_update_ratio: float = 1.0
    """An update as large as the parameter itself. Adam moves every element by ~lr, so a small
    model at a large learning rate sits near lr / init_std (0.3 for the demo at step 0)."""

    def __post_init__(self) -> None:
        if self.window < 2:
            raise ConfigError(f"window = {self.window!r} is not allowed: a whole number >= 2")
        for name in ("spike_factor", "explode_factor", "vanish_factor", "max_update_ratio"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} = {getattr(self, name)!r} is not allowed: a number > 0")


def _rolling_baseline(values: pd.Series, window: int) -> tuple[pd.Series, pd.Series]:
    """Median and median absolute deviation of the previous ``window`` finite values (not this one)."""
    past = values.where(np.isfinite(values)).shift(1).rolling(window, min_periods=max(2, window // 4))
    median = past.median()
    mad = past.apply(lambda w: float(np.nanmedian(np.abs(w - np.nanmedian(w)))), raw=True)
    return median, mad


def _nonfinite(scalars: pd.DataFrame, records: RunRecords | None, scalars_logged: bool) -> list[dict[str, object]]:
    if records is not None:
        stats = records.stats.sel(stat=["nan", "inf"]).sum("stat")
        first = first_true((stats > 0).to_pandas())  # step x site
        if first is not None:
            return [{"step": first.step, "rule": "nonfinite", "site": first.site,
                     "value": float(stats.sel(step=first.step, site=first.site)), "threshold": 0.0,
                     "detail": f"first NaN/Inf, in {first.site}; {first.count} sites hold NaN/Inf at that step"}]
    if not scalars_logged:  # NaN there says nothing was logged, not that the training went NaN
        return []
    for column in ("loss", "grad_norm"):
        values = scalars[column]
        bad_steps = values.index[~np.isfinite(values.to_numpy(dtype=float))]
        if len(bad_steps):
            step = int(bad_steps[0])
            return [{"step": step, "rule": "nonfinite", "site": f"scalar:{column}", "value": float(values.loc[step]),
                     "threshold": 0.0, "detail": f"{column} is {values.loc[step]} (no site records to say where)"}]
    return []


def _threshold_rows(values: pd.Series, limit: pd.Series, rule: str, site: str, above: bool,
                    detail: str) -> list[dict[str, object]]:
    hit = (values > limit if above else values < limit) & np.isfinite(values)  # NaN/Inf: the nonfinite rule
    return [{"step": int(step), "rule": rule, "site": site, "value": float(values.loc[step]),
             "threshold": float(limit.loc[step]), "detail": detail} for step in values.index[hit.fillna(False)]]


def find_anomalies(scalars: pd.DataFrame, records: RunRecords | None = None,
                   rules: AnomalyRules | None = None, *, scalars_logged: bool = True) -> pd.DataFrame:
    """Every anomaly of one run by the rules in the module docstring, sorted by step. ``scalars_logged=False``
    (``RunStore.logs_scalars`` of an import of tensors alone): the scalars are NaN because nothing was logged,
    so only the site records are judged."""
    rules = rules or AnomalyRules()
    rows = _nonfinite(scalars, records, scalars_logged)
    loss = scalars["loss"].astype(float)
    median, mad = _rolling_baseline(loss, rules.window)
    spike = median + rules.spike_factor * mad.clip(lower=1e-12)
    rows += _threshold_rows(loss, spike, "loss_spike", "scalar:loss", True,
                            f"loss above median + {rules.spike_factor:g} MAD of the previous {rules.window} steps")
    norm = scalars["grad_norm"].astype(float)
    norm_median, _ = _rolling_baseline(norm, rules.window)
    rows += _threshold_rows(norm, norm_median * rules.explode_factor, "grad_explode", "scalar:grad_norm", True,
                            f"gradient norm above {rules.explode_factor:g}x its rolling median")
    rows += _threshold_rows(norm, norm_median / rules.vanish_factor, "grad_vanish", "scalar:grad_norm", False,
                            f"gradient norm below 1/{rules.vanish_factor:g} of its rolling median")
    if records is not None:
        rows += _update_ratios(records, rules)
    table = pd.DataFrame(rows, columns=COLUMNS)
    return table.sort_values(["step", "rule"], kind="stable").reset_index(drop=True)


def _update_ratios(records: RunRecords, rules: AnomalyRules) -> list[dict[str, object]]:
    names = [split_site(s)[1] for s in records.sites if split_site(s)[0] == "update"]
    names = [n for n in names if f"param:{n}" in set(records.sites)]
    if not names:
        return []
    l2 = records.stats.sel(stat="l2")
    updates = l2.sel(site=[f"update:{n}" for n in names]).to_numpy()  # [step, parameter]
    params = l2.sel(site=[f"param:{n}" for n in names]).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(params > 0, updates / params, np.nan)  # a zero parameter (a fresh bias) has no ratio
    steps = records.stats["step"].to_numpy()
    judged = (steps >= rules.settle_steps)[:, None]
    low = (ratio < rules.min_update_ratio) & judged
    high = (ratio > rules.max_update_ratio) & judged
    rows = []
    for i, j in zip(*np.nonzero(low | high)):
        bound = rules.max_update_ratio if high[i, j] else rules.min_update_ratio
        rows.append({"step": int(steps[i]), "rule": "update_ratio", "site": f"update:{names[j]}",
                     "value": float(ratio[i, j]), "threshold": bound,
                     "detail": f"||update|| / ||param|| = {ratio[i, j]:.3g} outside "
                               f"[{rules.min_update_ratio:g}, {rules.max_update_ratio:g}]"})
    return rows

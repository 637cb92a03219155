"""Golden-values files: a few kilobytes a CI commits instead of a whole run store.

Two formats, told apart by their content:

* **Megatron-LM's functional-test format** (``golden_values_*.json``): per metric
  (``"lm loss"``, ``"grad-norm"``, ``"iteration-time"``, ...) ``start_step``, ``end_step``,
  ``step_interval`` and ``values`` keyed by the *1-based* iteration as a string; a missing
  value is the string ``"nan"``; values read from TensorBoard are rounded to 5 decimals.
  Checked with Megatron-LM's own semantics (``tests/functional_tests/python_test_utils/
  common.py``, ``pipeline``): the run's values are rounded to 5 decimals, ``"nan"`` counts
  as infinity on both sides, each step passes when ``numpy.isclose(actual, golden,
  rtol=rtol, atol=0)``; without ``rtol`` every step must be equal (its deterministic test),
  with ``rtol`` a metric passes when no more than ``min(max(n // 100, 1), 50)`` of its ``n``
  steps fail (its approximate test). ``iteration-time`` (machine speed) and metrics without
  a store scalar (``num-zeros``, ``mem-*``) are not checked, and the check says so.
* **The workbench's own format** (``"format": "workbench-golden-values"``): the per-step
  scalars at full precision, and per step a fingerprint of all the weights (the parameters as
  the step's forward saw them; a hash of every ``param`` site's fingerprint, so it does not
  depend on the layout) as a hex string (a uint64 does not survive as a JSON number), with
  the fingerprint definition's version. Checked bitwise, or with ``rtol`` as
  ``workbench.analysis.tolerance`` defines it for the scalars (a fingerprint has no
  tolerance: with ``rtol`` the weights are not checked, and the check says so).

Steps in this module are the store's, 0-based; Megatron's iteration ``k`` is step ``k - 1``.
Imports no torch, and reads no file: ``store.golden_file`` reads and writes them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.golden import Difference, GoldenCheck, scalar_check
from workbench.errors import ArgumentError, GoldenFileError
from workbench.statistics import FINGERPRINT_VERSION

WORKBENCH_FORMAT = "workbench-golden-values"
MEGATRON_METRICS: dict[str, str] = {"lm loss": "loss", "grad-norm": "grad_norm", "learning-rate": "lr",
                                    "loss-scale": "loss_scale", "iteration-time": "step_time"}
"""Megatron-LM's metric names and the store scalars they are."""
WORKBENCH_SCALARS: tuple[str, ...] = ("loss", "grad_norm", "lr", "loss_scale")
"""Scalars a workbench golden file holds (no timing: it depends on the machine)."""
_UNTIMED = ("step_time",)
_ROUND = 5  # decimals of Megatron's values read from TensorBoard


@dataclass(frozen=True)
class GoldenValues:
    """Reference values read from a golden file, by store step."""

    source: str
    format: str
    """``"megatron"`` or ``"workbench"``."""
    scalars: pd.DataFrame
    """Store scalar names as columns, store steps as index. Workbench files: NaN where the value was NaN.
    Megatron files: ``"nan"`` read as infinity (as Megatron-LM compares it), NaN where a metric has no value."""
    weights: pd.Series | None = None
    """Per step, the hex fingerprint of all the weights (workbench files)."""
    fingerprint_version: int | None = None
    unmapped: tuple[str, ...] = ()
    """Metrics of a Megatron file that no store scalar is."""
    run: str | None = None
    environment: Mapping[str, Any] | None = None
    """The environment's facts of the run that made the file (``workbench.environment``; workbench files written
    since they carry them)."""


# -- weights -----------------------------------------------------------------------------

def weights_fingerprints(fingerprints: pd.DataFrame) -> pd.Series:
    """Per step, one hex fingerprint of every ``param`` site's fingerprint (step x site, uint64)."""
    params = sorted(c for c in fingerprints.columns if str(c).startswith("param:"))
    out = {}
    for step, row in fingerprints[params].iterrows():
        digest = hashlib.sha256()
        for site, value in zip(params, row.to_numpy(dtype=np.uint64)):
            digest.update(f"{site}={int(value):016x};".encode())
        out[int(step)] = "0x" + digest.hexdigest()[:16]
    return pd.Series(out, dtype=object, name="weights")


# -- writing -----------------------------------------------------------------------------

def _json_value(value: float) -> float | str:
    return value if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))


def workbench_golden_values(scalars: pd.DataFrame, weights: pd.Series | None, *, run: str,
                            steps: int | None = None, environment: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The workbench golden file of a run (its scalars, per step; its weights' fingerprints, if recorded; the
    facts of its environment, where known)."""
    frame = scalars if steps is None else scalars[scalars.index < steps]
    out: dict[str, Any] = {
        "format": WORKBENCH_FORMAT, "version": 1, "fingerprint_version": FINGERPRINT_VERSION, "run": run,
        "steps": [int(s) for s in frame.index],
        "scalars": {name: [_json_value(float(v)) for v in frame[name]] for name in WORKBENCH_SCALARS
                    if name in frame},
    }
    if weights is not None and len(weights):
        kept = weights[weights.index.isin(frame.index)] if steps is not None else weights
        out["weights"] = {str(int(s)): str(v) for s, v in kept.items()}
    if environment:
        out["environment"] = dict(environment)
    return out


def megatron_golden_values(scalars: pd.DataFrame, *, steps: int | None = None, interval: int = 1) -> dict[str, Any]:
    """Megatron-LM's format of a run's scalars: 1-based iterations, 5 decimals, ``"nan"`` where missing."""
    if not isinstance(interval, int) or interval < 1:
        raise ArgumentError(f"interval = {interval!r}: a whole number of steps >= 1")
    last = int(scalars.index.max()) + 1 if len(scalars) else 0
    end = min(last, steps) if steps is not None else last
    iterations = [k for k in range(1, end + 1) if k == 1 or k % interval == 0]
    out = {}
    for metric, name in MEGATRON_METRICS.items():
        if name not in scalars:
            continue
        series = scalars[name]
        values: dict[str, float | str] = {}
        for k in iterations:
            v = float(series.get(k - 1, math.nan))
            values[str(k)] = round(v, _ROUND) if math.isfinite(v) else "nan"
        out[metric] = {"start_step": iterations[0] if iterations else 1, "end_step": end,
                       "step_interval": interval, "values": values}
    return out


# -- reading -----------------------------------------------------------------------------

def _number(value: Any, where: str) -> float:
    if isinstance(value, str) and value.lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return float(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise GoldenFileError(f"{where}: {value!r} is not a number (or \"nan\")")


def parse_golden_values(data: Any, source: str) -> GoldenValues:
    """The golden values of a golden file's JSON (``store.golden_file.read_golden_document``), of either format;
    ``GoldenFileError`` in one line, naming ``source``, for anything else."""
    if isinstance(data, dict) and data.get("format") == WORKBENCH_FORMAT:
        return _holds_a_step(_workbench(data, source))
    if isinstance(data, dict) and data and all(isinstance(v, dict) and "values" in v for v in data.values()):
        return _holds_a_step(_megatron(data, source))
    raise GoldenFileError(f"{source}: neither Megatron-LM's golden-values format (per metric: start_step, end_step, "
                          f"step_interval, values) nor a {WORKBENCH_FORMAT!r} file")


def _holds_a_step(golden: GoldenValues) -> GoldenValues:
    """``golden``, or ``GoldenFileError`` if it holds no value of any step: a check against it would pass any run."""
    if not golden.scalars.notna().any().any() and (golden.weights is None or golden.weights.empty):
        raise GoldenFileError(f"{golden.source}: holds no value of any step, so a check against it would pass any "
                              "run; write it again from a run that has recorded steps")
    return golden


def _workbench(data: dict[str, Any], source: str) -> GoldenValues:
    if data.get("version") != 1:
        raise GoldenFileError(f"{source}: {WORKBENCH_FORMAT} version {data.get('version')!r}; this workbench "
                              "reads version 1")
    version = data.get("fingerprint_version")
    if "weights" in data and version != FINGERPRINT_VERSION:
        raise GoldenFileError(f"{source}: its weight fingerprints use definition version {version!r}, this "
                              f"workbench computes version {FINGERPRINT_VERSION}; export the file again")
    steps = data.get("steps")
    if not isinstance(steps, list) or not all(isinstance(s, int) for s in steps):
        raise GoldenFileError(f"{source}: 'steps' must be a list of step numbers")
    columns = {}
    for name, values in (data.get("scalars") or {}).items():
        if not isinstance(values, list) or len(values) != len(steps):
            raise GoldenFileError(f"{source}: scalar {name!r} must have one value per step ({len(steps)})")
        columns[name] = [_number(v, f"{source}: {name}") for v in values]
    weights = None
    if "weights" in data:
        raw = data["weights"]
        if not isinstance(raw, dict) or not all(isinstance(v, str) and v.startswith("0x") for v in raw.values()):
            raise GoldenFileError(f"{source}: 'weights' must map steps to hex strings (\"0x...\")")
        weights = pd.Series({int(k): v for k, v in raw.items()}, dtype=object, name="weights")
    environment = data.get("environment")
    if environment is not None and not isinstance(environment, dict):
        raise GoldenFileError(f"{source}: 'environment' must be a mapping of facts")
    return GoldenValues(source=source, format="workbench", scalars=pd.DataFrame(columns, index=pd.Index(steps,
                        name="step")), weights=weights, fingerprint_version=version, run=data.get("run"),
                        environment=environment)


def _megatron(data: dict[str, Any], source: str) -> GoldenValues:
    columns: dict[str, pd.Series] = {}
    unmapped = []
    for metric, entry in data.items():
        name = MEGATRON_METRICS.get(metric)
        if name is None:
            unmapped.append(metric)
            continue
        values = entry["values"]
        if not isinstance(values, dict):
            raise GoldenFileError(f"{source}: {metric!r} values must map iterations to numbers")
        if not all(isinstance(k, str) and k.strip().isascii() and k.strip().isdigit() for k in values):
            raise GoldenFileError(f"{source}: {metric!r} has an iteration that is not a whole number")
        iterations = {int(k): _number(v, f"{source}: {metric} at {k}") for k, v in values.items()}
        # Megatron-LM compares "nan" as infinity; NaN is left for steps this metric does not have
        columns[name] = pd.Series({k - 1: (math.inf if math.isnan(v) else v) for k, v in iterations.items()},
                                  dtype=np.float64)
    frame = pd.DataFrame(columns).sort_index()
    frame.index.name = "step"
    return GoldenValues(source=source, format="megatron", scalars=frame, unmapped=tuple(unmapped))


# -- checking ----------------------------------------------------------------------------

def golden_values_check(scalars: pd.DataFrame, weights: pd.Series | None, golden: GoldenValues, *, run: str,
                        rtol: float | None = None, steps: int | None = None) -> GoldenCheck:
    """Check a run's scalars (and weight fingerprints) against a golden file, in the file's own semantics."""
    if rtol is not None and not rtol >= 0:
        raise ArgumentError(f"rtol = {rtol!r} is not allowed: a number >= 0")
    if golden.format == "megatron":
        return _megatron_check(scalars, golden, run=run, rtol=rtol, steps=steps)
    wanted = [int(s) for s in golden.scalars.index if steps is None or s < steps]
    differences = [Difference(s, "(all scalars)", "step not written by the run") for s in wanted
                   if s not in scalars.index]
    found, names = scalar_check(scalars, golden.scalars, tuple(golden.scalars.columns), steps, rtol)
    differences += found
    notes = []
    checked = list(names)
    if golden.weights is not None:
        if rtol is not None:
            notes.append("weights not checked: a fingerprint is exact, it has no tolerance")
        elif weights is None or not len(weights):
            differences.append(Difference(None, "weights", "the run recorded no param sites"))
        else:
            checked.append("weights")
            for step, expected in golden.weights.items():
                if steps is not None and step >= steps:
                    continue
                got = weights.get(step)
                if got is None:
                    differences.append(Difference(int(step), "weights", "step not recorded by the run"))
                elif got != expected:
                    differences.append(Difference(int(step), "weights", f"fingerprint {got} != {expected}"))
    return GoldenCheck(run=run, golden=golden.source, steps=[s for s in wanted if s in scalars.index], sites=0,
                       rtol=rtol, differences=sorted(differences, key=lambda d: (d.step is not None, d.step or 0)),
                       scalars=tuple(checked), notes=tuple(notes))


def megatron_close(actual: np.ndarray, golden: np.ndarray, rtol: float | None) -> tuple[np.ndarray, np.ndarray,
                                                                                    np.ndarray]:
    """(the run's values as Megatron-LM compares them, the golden ones, whether each pair is close): rounded to
    5 decimals, NaN as infinity, ``numpy.isclose`` with ``rtol`` (exact without it)."""
    actual = np.round(np.asarray(actual, dtype=np.float64), _ROUND)
    golden = np.asarray(golden, dtype=np.float64)
    actual, golden = np.where(np.isnan(actual), np.inf, actual), np.where(np.isnan(golden), np.inf, golden)
    return actual, golden, np.isclose(actual, golden, rtol=rtol or 0.0, atol=0.0)


def megatron_allowance(total: int, rtol: float | None) -> int:
    """Steps of a metric's ``total`` that Megatron-LM's approximate test (``rtol``) lets fail; none when exact."""
    return 0 if rtol is None or total == 1 else min(max(total // 100, 1), 50)


def _megatron_check(scalars: pd.DataFrame, golden: GoldenValues, *, run: str, rtol: float | None,
                    steps: int | None) -> GoldenCheck:
    mode = "Megatron-LM exact, 5 decimals" if rtol is None else f"Megatron-LM approximate, rtol {rtol:g}"
    notes = [f"{m}: no such scalar in a run store, not checked" for m in golden.unmapped]
    differences: list[Difference] = []
    checked = []
    all_steps: set[int] = set()
    for name in golden.scalars.columns:
        if name in _UNTIMED:
            notes.append(f"{name}: timing depends on the machine, not checked")
            continue
        expected = golden.scalars[name].dropna()  # the file's steps of this metric ("nan" was read as inf)
        wanted = [int(s) for s in expected.index if steps is None or s < steps]
        missing = [s for s in wanted if s not in scalars.index or name not in scalars]
        differences += [Difference(s, name, "step not written by the run") for s in missing]
        present = [s for s in wanted if s not in missing]
        if not present:
            continue
        checked.append(name)
        all_steps.update(present)
        actual, ref, close = megatron_close(scalars.loc[present, name].to_numpy(np.float64),
                                            expected.loc[present].to_numpy(np.float64), rtol)
        failing = [Difference(present[i], name, f"{float(actual[i])!r} vs {float(ref[i])!r}")
                   for i in np.flatnonzero(~close)]
        total = len(wanted)
        allowed = megatron_allowance(total, rtol)
        if len(failing) + len(missing) > allowed:
            differences += failing
        elif failing:
            notes.append(f"{name}: {len(failing)} of {total} steps outside rtol, within the {allowed} "
                         "Megatron-LM allows")
    return GoldenCheck(run=run, golden=golden.source, steps=sorted(all_steps), sites=0, rtol=rtol,
                       differences=differences, scalars=tuple(checked), mode=mode, notes=tuple(notes))

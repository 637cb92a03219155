"""What a folder of runs measures beyond pairs: each change per layer against the noise floor, the determinism
tax per configuration and per source, and each change judged against the noise floor and the seed spread.
``Workspace.ladder``, ``.noise_ladder``, ``.seed_ladder``, ``.cost``, ``.source_cost``, ``.attribution`` and
``.scales`` forward here; the analysis itself is ``analysis.ladder``, ``analysis.cost``, ``analysis.sources`` and
``analysis.scales``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from workbench.analysis.cost import COLUMNS as COST_COLUMNS
from workbench.analysis.cost import ThroughputSample, determinism_cost
from workbench.analysis.ladder import Ladder, ladder_of
from workbench.analysis.noise_floor import leaves_floor
from workbench.analysis.scales import judge_against_scales
from workbench.analysis.sources import COLUMNS as SOURCE_COLUMNS
from workbench.analysis.sources import attribution as source_attribution
from workbench.analysis.sources import source_cost as costs_by_source
from workbench.errors import ArgumentError
from workbench.studies.reading_ahead import Pause

if TYPE_CHECKING:
    from workbench.studies.workspace import Workspace

MEASURES = ("tokens_per_s", "step_time")


def ladder(ws: Workspace, reference: str, names: tuple[str, ...], stat: str, floor: bool,
           pause: Pause | None) -> Ladder:
    """``analysis.ladder.ladder_of`` of ``names`` against ``reference``. The relative differences of a pair of stores
    that read statistics apart are made from ``stat`` read for it and dropped (with ``pause``, a background read's);
    other pairs' are held (``Workspace.relative_difference``)."""
    comparisons = [ws.comparison(reference, n) for n in names]
    apart = [n for n in names if ws.runs[reference].reads_statistics_apart and ws.runs[n].reads_statistics_apart]
    held = ws.peek_stat_values(reference, stat, pause=pause) if apart else None
    relatives = {n: (result.relative(stat, (held, ws.peek_stat_values(n, stat, pause=pause)))
                     if held is not None and n in apart else ws.relative_difference(reference, n, stat))
                 for n, result in zip(names, comparisons, strict=True)}
    checks = {n: leaves_floor(ws.records(n), ws.floor) for n in names} if floor and ws.floor is not None else {}
    return ladder_of(reference, comparisons, stat=stat, floor_checks=checks, relatives=relatives)


def noise_ladder(ws: Workspace, reference: str, stat: str, pause: Pause | None) -> Ladder | None:
    """The noise-floor runs against ``reference``; None without them."""
    repeats = [n for n in ws.roles.floor_runs if n != reference]
    return ws.ladder(repeats, reference=reference, stat=stat, floor=False, pause=pause) if repeats else None


def own_band(ws: Workspace, reference: str) -> list[str]:
    """The band runs of ``reference``'s own precision's rounding (a bf16 band is for bf16 runs)."""
    precision = ws.runs[reference].manifest.precision or "fp32"
    return [n for n in ws.roles.band_runs
            if n in ws.recorded and (ws.runs[n].manifest.perturbation or {}).get("precision") == precision]


def band_ladder(ws: Workspace, reference: str, stat: str, pause: Pause | None) -> Ladder | None:
    """The reference's band runs of its own precision's rounding against it (the rounding band); None without
    them."""
    band = own_band(ws, reference)
    return ws.ladder(band, reference=reference, stat=stat, floor=False, pause=pause) if band else None


def seed_ladder(ws: Workspace, reference: str, stat: str, pause: Pause | None) -> Ladder | None:
    """The other seeds against ``reference`` (or, when it has none, against the first of the seed runs); None
    without them."""
    recorded = [n for n in ws.roles.seed_runs if n in ws.recorded]
    base = reference if reference in recorded else (recorded[0] if recorded else reference)
    others = [n for n in recorded if ws.runs[n].manifest.seed != ws.runs[base].manifest.seed]
    return ws.ladder(others, reference=base, stat=stat, floor=False, pause=pause) if others else None


def rate(ws: Workspace, name: str, measure: str) -> np.ndarray:
    """Per step: tokens/s (``tokens_per_s``), or steps/s from the step time (``step_time``)."""
    if measure not in MEASURES:
        raise ArgumentError(f"measure {measure!r}: tokens_per_s or step_time")
    values = ws.scalars(name)[measure].to_numpy(dtype=float)
    return values if measure == "tokens_per_s" else 1.0 / values


def cost(ws: Workspace, *, measure: str, warmup: int, interval: float,
         configs: Iterable[str] | None) -> pd.DataFrame:
    """``analysis.cost.determinism_cost`` of the runs (faulted ones left out), of ``configs`` only if given."""
    wanted = set(configs) if configs is not None else None
    samples = [ThroughputSample(run.manifest.configuration(), bool(run.manifest.deterministic), rate(ws, name, measure))
               for name, run in ws.runs.items()
               if name not in ws.roles.faulted and run.manifest.deterministic is not None
               and (wanted is None or run.manifest.configuration() in wanted)]
    return determinism_cost(samples, warmup=warmup, interval=interval)


def source_cost(ws: Workspace, *, measure: str, warmup: int, interval: float) -> pd.DataFrame:
    """``analysis.sources.source_cost``: each source's runs against the all-off runs of the reference's
    configuration; empty without both."""
    rates: dict[str, list[np.ndarray]] = {}
    for name, label in ws.roles.source_runs.items():
        rates.setdefault(label, []).append(rate(ws, name, measure))
    baseline = [rate(ws, n, measure) for n in ws.roles.all_off_runs] if rates else []
    if not baseline:
        return pd.DataFrame(columns=COST_COLUMNS)
    return costs_by_source(rates, baseline, warmup=warmup, interval=interval)


def attribution(ws: Workspace, *, stat: str, warmup: int, interval: float) -> pd.DataFrame:
    """``analysis.sources.attribution``: the first run of each source against the reference, with the noise floor,
    and what the source costs; empty without source runs."""
    if not ws.roles.source_runs:
        return pd.DataFrame(columns=SOURCE_COLUMNS)
    first: dict[str, str] = {}  # the first run of each source: its row
    for name, label in sorted(ws.roles.source_runs.items()):
        first.setdefault(label, name)
    summary = ws.ladder(list(first.values()), stat=stat).summary
    costs = source_cost(ws, measure="tokens_per_s", warmup=warmup, interval=interval)
    table = source_attribution(summary, {name: label for label, name in first.items()}, costs)
    table.attrs["stat"] = stat  # what the final differences are of: the figure's axis says it
    return table


def scales(ws: Workspace, column: str, names: Iterable[str] | None) -> tuple[int | None, pd.DataFrame]:
    """``analysis.scales.judge_against_scales`` of ``column`` at the last step where the reference, the runs
    (default: ``others``), the noise-floor and the seed runs all have a value; (None, empty) if none."""
    roles = ws.roles
    names = list(names) if names is not None else roles.others
    involved = list(dict.fromkeys([roles.reference, *names, *roles.floor_runs, *roles.seed_runs]))
    table = pd.DataFrame(ws.scalar(column, involved)).dropna()
    if table.empty or not names:
        return None, judge_against_scales({}, reference=roles.reference, runs=[], floor_runs=[], seed_runs=[])
    step = int(table.index[-1])
    final = {name: float(table.loc[step, name]) for name in involved}
    return step, judge_against_scales(final, reference=roles.reference, runs=names, floor_runs=roles.floor_runs,
                                      seed_runs=roles.seed_runs)

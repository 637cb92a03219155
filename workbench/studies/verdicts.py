"""Bug or rounding on run stores: which runs make a reference's band, and the verdict on a run against it.

    verdict = rounding_verdict(open_run(RUN), open_run(REF))          # band runs found beside REF
    verdict = rounding_verdict(run, ref, band=[open_run(P1), ...])    # or named
    print(verdict.summary())                                          # what ``workbench verdict`` prints

The band runs of a reference are runs of its model, layout and seed whose manifest says which rounding they
carry (``perturbation``, from ``record(..., perturb=PRECISION)``), of the precision the judged run computes in
(a bf16 run is held to bf16's rounding, not fp32's), and, for a band of the reference's own precision, its
nondeterministic repeats (``roles.repeat_key``). What judges is ``analysis.rounding``; this module reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd

from workbench.analysis.rounding import UNIT_ROUNDOFF, RoundingBand, RoundingVerdict, judge, rounding_band
from workbench.config import RunConfig
from workbench.errors import IncomparableRunsError, WorkbenchError
from workbench.store.manifest import RunManifest
from workbench.store.reader import Run, find_runs, open_run
from workbench.store.records import RunRecords
from workbench.studies.roles import code_key, repeat_key


def band_precision(run: Run, reference: Run) -> str:
    """The rounding ``run`` is held to: the lower of the two runs' precisions (fp32 where neither says)."""
    order = list(UNIT_ROUNDOFF)  # finest first
    known = [p for p in (run.manifest.precision, reference.manifest.precision) if p in UNIT_ROUNDOFF]
    return max(known, key=order.index) if known else "fp32"


def is_band_run(candidate: Run, reference: Run, precision: str) -> bool:
    """Whether ``candidate`` belongs to ``reference``'s band of ``precision``'s rounding."""
    mine, theirs = candidate.manifest, reference.manifest
    if candidate.path.resolve() == reference.path.resolve() or not candidate.has_sites:
        return False
    if mine.perturbation is not None:
        return (mine.perturbation.get("precision") == precision and mine.model == theirs.model
                and mine.layout == theirs.layout and mine.precision == theirs.precision and mine.seed == theirs.seed)
    return precision == theirs.precision and mine.deterministic is False and _only_determinism_differs(mine, theirs)


def _only_determinism_differs(mine: RunManifest, theirs: RunManifest) -> bool:
    """Whether two runs are repeats of one configuration but for Megatron's deterministic switch."""
    if mine.config is not None and theirs.config is not None:  # the runner's: the configs, the switch set alike
        try:
            configs = [RunConfig.from_dict({**c, "deterministic": True}) for c in (mine.config, theirs.config)]
        except WorkbenchError:
            return False
        return configs[0].numerics_hash() == configs[1].numerics_hash() and code_key(mine) == code_key(theirs)
    keys = [repeat_key(dataclasses.replace(info, deterministic=True, determinism={})) for info in (mine, theirs)]
    return keys[0] is not None and keys[0] == keys[1]


def enough(runs: Sequence[Run]) -> bool:
    """Whether ``runs`` make a band: two or more with rounding noise added. Nondeterministic repeats add to a band
    but make none alone: they reorder a few reductions (the emulated embedding atomics, say), not all a layout
    reorders: the demo's correct TP=2 run leaves the band of its two emulated repeats at step 1, by 2.7 tolerances."""
    return sum(run.manifest.perturbation is not None for run in runs) >= 2


def band_runs(reference: Run, precision: str, *, folder: str | Path | None = None) -> list[Run]:
    """The runs of ``folder`` (default: the reference's own folder's parent) that make ``reference``'s band."""
    where = Path(folder) if folder is not None else reference.path.parent
    if not where.is_dir():  # a run read from a URL: its band is named (``--band``), not looked for
        return []
    found = []
    for path in find_runs(where):
        try:
            candidate = open_run(path)
        except WorkbenchError:  # a run that cannot be read is no band run; `workbench ls` names it
            continue
        if is_band_run(candidate, reference, precision):
            found.append(candidate)
    return found


def rounding_verdict(run: Run, reference: Run, *, band: Sequence[Run] | None = None) -> RoundingVerdict:
    """``run`` against ``reference`` and its band (found beside the reference where not given); a band of fewer
    than two runs is refused, naming the call that records more."""
    precision = band_precision(run, reference)
    runs = list(band) if band is not None else band_runs(reference, precision)
    if band is None and not enough(runs):
        raise IncomparableRunsError(
            f"{reference.name} has {sum(r.manifest.perturbation is not None for r in runs)} band run(s) of "
            f"{precision}'s rounding beside it; a verdict needs two or more: record the reference's loop again with "
            f"record(..., perturb={precision!r}) (six make a calibrated margin: docs/bug-or-rounding.md)")
    records = reference.records()
    return judge(run.records(), records, rounding_band(records, [r.records() for r in runs], precision=precision),
                 replicas_parted=run.manifest.replicas_parted)


def verdict_or_reason(run: Run, reference: Run) -> RoundingVerdict | str:
    """``rounding_verdict`` with the band found beside ``reference``, or why there is none (one line): what
    ``workbench compare`` adds to its answer, which a band it cannot judge with never fails."""
    try:
        return rounding_verdict(run, reference)
    except WorkbenchError as err:
        return str(err)


VERDICT_COLUMNS = ["run", "verdict", "first_step", "first_site", "tolerances", "rounding", "band"]


def verdict_table(runs: Mapping[str, Run], reference: str, changes: Sequence[str],
                  records: Callable[[str], RunRecords]) -> pd.DataFrame:
    """Each run of ``changes`` against ``reference`` and the band of its precision among ``runs``: its verdict,
    the first step and site beyond rounding, the tolerances there (the largest anywhere, when within) and the
    band (runs x margin); a change without a band (``enough``) says so in its verdict."""
    rows = []
    bands: dict[str, RoundingBand | None] = {}
    for name in changes:
        precision = band_precision(runs[name], runs[reference])
        if precision not in bands:
            members = [n for n in runs if is_band_run(runs[n], runs[reference], precision)]
            bands[precision] = rounding_band(records(reference), [records(n) for n in members],
                                             precision=precision) if enough([runs[n] for n in members]) else None
        band = bands[precision]
        if band is None:
            rows.append({"run": name, "verdict": f"no band of {precision}'s rounding", "first_step": None,
                         "first_site": None, "tolerances": float("nan"), "rounding": precision, "band": ""})
            continue
        verdict = judge(records(name), records(reference), band, replicas_parted=runs[name].manifest.replicas_parted)
        rows.append({"run": name, "verdict": verdict.words,
                     "first_step": verdict.first_step, "first_site": verdict.first_site,
                     "tolerances": verdict.worst_ratio if verdict.within else verdict.first_ratio,
                     "rounding": precision, "band": f"{len(verdict.band_runs)} x {verdict.margin:.3g}"})
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS).astype({"first_step": "Int64"})

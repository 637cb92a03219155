"""Findings of a study in sentences: which runs repeat bitwise, where the others first differ.

``study_findings`` takes the records of a study's runs by name and a reference run and
compares every run with the reference (repeats with their first repeat; a resumed run from
its resume step on); the demo prints the result. Pure: records in, sentences out.
"""

from __future__ import annotations

import re

from workbench.analysis.compare import Comparison, compare
from workbench.analysis.records import RunRecords
from workbench.analysis.resume import resume_check

REPEAT = re.compile(r"^(?P<base>.+)-r(?P<index>\d+)$")
"""Repeats of one configuration are named ``<base>-r<i>``."""


def repeat_groups(names: list[str]) -> dict[str, list[str]]:
    """Repeats by their base name, each group sorted (``det-r0``, ``det-r1`` under ``det``)."""
    groups: dict[str, list[str]] = {}
    for name in names:
        match = REPEAT.match(name)
        if match:
            groups.setdefault(match["base"], []).append(name)
    return {base: sorted(group) for base, group in groups.items()}


def _largest(result: Comparison) -> float:
    rel = result.relative_difference.sel(stat="l2").isel(step=-1)
    return float(rel.max(skipna=True)) if rel.size else 0.0


def describe(result: Comparison, label: str) -> str:
    if result.identical:
        return (f"{label}: bitwise identical at all {len(result.common_steps)} recorded steps x "
                f"{len(result.common_sites)} sites")
    origins = ", ".join(result.origin_sites[:3]) + (" ..." if len(result.origin_sites) > 3 else "")
    return (f"{label}: first differ at step {result.first_step}, site {result.first_site} "
            f"(origins: {origins}); at the last step the largest relative L2 difference is {_largest(result):.2e}")


def study_findings(records: dict[str, RunRecords], reference: str) -> list[str]:
    """One sentence per comparison: repeats against their first repeat, every other run against ``reference``."""
    lines = []
    groups = repeat_groups(list(records))
    for names in groups.values():
        first, *others = names
        for other in others:
            lines.append(describe(compare(records[first], records[other]), f"repeats {first} vs {other}"))
    noise = [compare(records[n[0]], records[n[1]]) for n in groups.values() if len(n) > 1]
    floor = max((_largest(r) for r in noise if not r.identical), default=None)
    for name, run in records.items():
        if name == reference or REPEAT.match(name):
            continue
        if run.resumes:
            lines.append(resume_check(run, records[reference]).summary())
            continue
        result = compare(records[reference], run)
        line = describe(result, f"{name} vs {reference}")
        if floor is not None and not result.identical:
            line += f" (nondeterministic repeats: {floor:.2e})"
        lines.append(line)
    return lines

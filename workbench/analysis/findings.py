"""Findings of a study in sentences: which runs repeat bitwise, where the others first differ.

``study_findings`` takes the records of a study's runs by name, a reference run and the
groups of repeats (``Roles.repeat_groups``: read from the manifests, never from names),
and compares every run with the reference (repeats with their first repeat; a resumed run
from its resume step on); the demo prints the result. Pure: records in, sentences out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from workbench.analysis.compare import Comparison, compare
from workbench.analysis.resume import resume_check
from workbench.environment import difference
from workbench.store.records import RunRecords


def _largest(result: Comparison) -> float:
    rel = result.relative("l2").isel(step=-1)
    return float(rel.max(skipna=True)) if rel.size else 0.0


def describe(result: Comparison, label: str) -> str:
    if result.identical:
        return (f"{label}: bitwise identical at all {len(result.common_steps)} recorded steps x "
                f"{len(result.common_sites)} sites")
    origins = ", ".join(result.origin_sites[:3]) + (" ..." if len(result.origin_sites) > 3 else "")
    return (f"{label}: first differ at step {result.first_step}, site {result.first_site} "
            f"(origins: {origins}); at the last step the largest relative L2 difference is {_largest(result):.2e}")


def study_findings(records: dict[str, RunRecords], reference: str, repeats: list[list[str]], *,
                   comparison: Callable[[str, str], Comparison] | None = None,
                   runtimes: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """One sentence per comparison: each group of ``repeats`` against its first run, every other run
    against ``reference``. ``comparison(a, b)`` compares two runs by name (a cache: ``Workspace.comparison``);
    by default ``compare`` of their records. With ``runtimes`` (each run's ``RunManifest.runtime``), a pair
    that differs and whose environments differ gets a second line naming the facts."""
    pair = comparison or (lambda a, b: compare(records[a], records[b]))

    def environment_line(a: str, b: str, result: Comparison) -> str:
        if runtimes is None or result.identical or a not in runtimes or b not in runtimes:
            return ""
        facts = difference(runtimes[b], runtimes[a])
        return f"\n  {facts.summary()}" if facts.differences else ""

    lines = []
    groups = [[n for n in group if n in records] for group in repeats]
    groups = [g for g in groups if len(g) > 1]
    noise = []
    for first, *others in groups:
        for i, other in enumerate(others):
            result = pair(first, other)
            lines.append(describe(result, f"repeats {first} vs {other}") + environment_line(first, other, result))
            if i == 0:
                noise.append(result)
    floor = max((_largest(r) for r in noise if not r.identical), default=None)
    repeating = {n for g in groups for n in g[1:]}
    for name, run in records.items():
        if name == reference or name in repeating:
            continue
        if run.resumes:
            lines.append(resume_check(run, records[reference]).summary())
            continue
        result = pair(reference, name)
        line = describe(result, f"{name} vs {reference}")
        if floor is not None and not result.identical:
            line += f" (nondeterministic repeats: {floor:.2e})"
        lines.append(line + environment_line(reference, name, result))
    return lines

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
from workbench.config import flatten
from workbench.environment import difference
from workbench.sites import split_site
from workbench.store.records import RunRecords


def _largest(result: Comparison) -> float:
    rel = result.relative_difference.sel(stat="l2").isel(step=-1)  # the last step alone
    return float(rel.max(skipna=True)) if rel.size else 0.0


def describe(result: Comparison, label: str) -> str:
    """One line on a comparison, headed ``label``: bitwise identical over how many steps and sites, or where the
    runs first differ, from which sites, and how far apart they end."""
    if result.identical:
        return (f"{label}: bitwise identical at all {len(result.common_steps)} recorded steps x "
                f"{len(result.common_sites)} sites")
    origins = ", ".join(result.origin_sites[:3]) + (" ..." if len(result.origin_sites) > 3 else "")
    return (f"{label}: first differ at step {result.first_step}, site {result.first_site} "
            f"(origins: {origins}); at the last step the largest relative L2 difference is {_largest(result):.2e}")


SHARING = ("optim.use_distributed_optimizer", "optim.overlap_grad_reduce", "optim.overlap_param_gather")
"""The config keys that split the optimizer's work and communication over the data-parallel ranks."""
_NOT_NUMERICS = ("name", "flush_every", "checkpoint_every", "checkpoint_format", "record.", "eval.")


def config_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """``key a vs b`` for every config field that shapes the numbers and differs (configs as manifests hold
    them; a field one config lacks is read as absent)."""
    fa, fb = flatten(a), flatten(b)
    return [f"{key} {fa.get(key, 'absent')} vs {fb.get(key, 'absent')}" for key in sorted(set(fa) | set(fb))
            if not key.startswith(_NOT_NUMERICS) and fa.get(key) != fb.get(key)]


def _optimizer_first(result: Comparison) -> bool:
    """True when every site but the optimizer's (its moments and the update) agrees at the first differing step."""
    equal = result.equal.loc[result.first_step]
    return all(bool(equal[s]) for s in result.common_sites
               if split_site(s)[0] not in ("exp_avg", "exp_avg_sq", "update"))


def study_findings(records: dict[str, RunRecords], reference: str, repeats: list[list[str]], *,
                   comparison: Callable[[str, str], Comparison] | None = None,
                   runtimes: Mapping[str, Mapping[str, Any]] | None = None,
                   configs: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """One sentence per comparison: each group of ``repeats`` against its first run, every other run
    against ``reference``. ``comparison(a, b)`` compares two runs by name (a cache: ``Workspace.comparison``);
    by default ``compare`` of their records. With ``runtimes`` (each run's ``RunManifest.runtime``), a pair
    that differs and whose environments differ gets a second line naming the facts. With ``configs`` (each
    run's config as its manifest holds it), a run that differs from another run of the folder only in how
    the optimizer's work is shared (``SHARING``: the distributed optimizer, overlapped communication) is also
    compared with that run, and the line says which settings differ and, where every site before the
    optimizer's agrees, that the optimizer is the first to differ."""
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
    for name, twin in _sharing_twins(records, configs or {}):
        result = pair(twin, name)
        line = describe(result, f"{name} vs {twin}") + "\n  the configs differ in: " + "; ".join(
            config_difference((configs or {})[name], (configs or {})[twin]))
        if not result.identical and _optimizer_first(result):
            clipped = (flatten((configs or {})[name]).get("optim.clip_grad") or 0) > 0
            line += (f"\n  every forward, backward and reduced-gradient site agrees at step {result.first_step}: "
                     "the optimizer's step is the first to differ" + (
                         " (its gradient norm, summed over each rank's shard and then over the ranks in place of "
                         "over whole parameters, scales every clipped update)" if clipped else ""))
        lines.append(line)
    return lines


def _sharing_twins(records: Mapping[str, RunRecords], configs: Mapping[str, Mapping[str, Any]]
                   ) -> list[tuple[str, str]]:
    """(run, twin) for each run that shares the optimizer's work and a run of the folder with the same config
    but for ``SHARING`` that does not: the distributed optimizer's run and its plain twin."""
    flat = {name: flatten(configs[name]) for name in records if name in configs}
    sharing = {name for name, fields in flat.items() if any(fields.get(key) for key in SHARING)}
    found = []
    for name in sorted(sharing, key=list(records).index):
        for twin in flat:
            if twin in sharing:
                continue
            keys = {line.split(" ", 1)[0] for line in config_difference(configs[name], configs[twin])}
            if keys and keys <= set(SHARING):
                found.append((name, twin))
                break
    return found

"""The pair matrix: the first divergent step of every pair of runs in a folder, with the runs
that are bitwise identical grouped — the overview a study of layouts, precisions or sources
starts from.

    matrix = pair_matrix(names, ws.comparison)     # any (a, b) -> Comparison
    matrix.first_step        # N x N, <NA> where a pair is identical (and on the diagonal)
    matrix.groups            # runs bitwise identical to each other, in the matrix's order

Each pair is compared once (``analysis.compare``, through the callable: a workspace caches
it). A pair that cannot be compared (different models) is marked, not dropped. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import pandas as pd

from workbench.analysis.compare import Comparison
from workbench.errors import ArgumentError, IncomparableRunsError


class PairVerdict(StrEnum):
    """How two runs of a folder compare."""

    IDENTICAL = "identical"
    DIFFER = "differ"
    INCOMPARABLE = "incomparable"


@dataclass(frozen=True)
class PairMatrix:
    names: list[str]
    """The runs, identical groups adjacent (groups in order of their first run's name)."""
    first_step: pd.DataFrame
    """First divergent step of each pair (Int64); <NA> where identical, on the diagonal and where incomparable."""
    identical: pd.DataFrame
    """bool: the pair is bitwise identical at every common recorded step (True on the diagonal)."""
    groups: list[list[str]]
    """Runs bitwise identical to each other, two or more per group."""
    incomparable: dict[tuple[str, str], str] = field(default_factory=dict)
    """Pairs that cannot be compared, with the reason."""

    def table(self) -> pd.DataFrame:
        """One row per pair (a < b in the matrix's order): first step, first site, verdict."""
        rows = []
        for i, a in enumerate(self.names):
            for b in self.names[i + 1:]:
                verdict = (PairVerdict.INCOMPARABLE if (a, b) in self.incomparable else
                           PairVerdict.IDENTICAL if self.identical.loc[a, b] else PairVerdict.DIFFER)
                rows.append({"a": a, "b": b, "verdict": verdict, "first_step": self.first_step.loc[a, b]})
        return pd.DataFrame(rows, columns=["a", "b", "verdict", "first_step"])


def pair_matrix(names: Sequence[str], comparison: Callable[[str, str], Comparison]) -> PairMatrix:
    """Compare every pair of ``names`` with ``comparison(a, b)``."""
    names = sorted(dict.fromkeys(names))
    if len(names) < 2:
        raise ArgumentError(f"a pair matrix needs two or more runs with per-site records, not {len(names)}")
    first: dict[tuple[str, str], int | None] = {}
    same: dict[tuple[str, str], bool] = {}
    incomparable: dict[tuple[str, str], str] = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            try:
                result = comparison(a, b)
            except IncomparableRunsError as err:
                incomparable[(a, b)] = incomparable[(b, a)] = str(err)
                continue
            same[(a, b)] = same[(b, a)] = result.identical
            first[(a, b)] = first[(b, a)] = result.first_step
    groups = _identical_groups(names, same)
    order = [n for g in _with_singletons(names, groups) for n in g]
    steps = pd.DataFrame(pd.NA, index=order, columns=order, dtype="Int64")
    identical = pd.DataFrame(False, index=order, columns=order)
    for a in order:
        identical.loc[a, a] = True
        for b in order:
            if (a, b) in same:
                identical.loc[a, b] = same[(a, b)]
                if not same[(a, b)] and first[(a, b)] is not None:
                    steps.loc[a, b] = first[(a, b)]
    return PairMatrix(names=order, first_step=steps, identical=identical, groups=groups, incomparable=incomparable)


def _identical_groups(names: list[str], same: dict[tuple[str, str], bool]) -> list[list[str]]:
    parent = {n: n for n in names}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for (a, b), equal in same.items():
        ra, rb = root(a), root(b)
        if equal and ra != rb:
            parent[max(ra, rb)] = min(ra, rb)  # the group is named after its first run
    members: dict[str, list[str]] = {}
    for n in names:
        members.setdefault(root(n), []).append(n)
    return [g for g in members.values() if len(g) > 1]


def _with_singletons(names: list[str], groups: list[list[str]]) -> list[list[str]]:
    grouped = {n: g for g in groups for n in g}
    out: list[list[str]] = []
    for n in names:
        if n not in grouped:
            out.append([n])
        elif grouped[n][0] == n:
            out.append(grouped[n])
    return out

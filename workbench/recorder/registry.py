"""The sites a recording sees, in execution order, and the one registry every rank shares.

In the first recorded step each rank registers a site when it first sees it, counted or not
(so that replicas number their sites alike), with its place in the step's execution order:
(kind, pipeline stage -- the backward kinds in reverse --, position seen, global expert,
position seen). After that step the ranks gather what they saw into one registry, the same
list on every rank (collective); a site that first appears in a later step is an error, since
every recorded step must see the same sites. Global rank 0 writes the registry as the store's
``sites`` group (or finds it there, when a run resumes).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench.errors import DamagedStoreError
from workbench.recorder.targets import ParallelRanks, all_gather_objects
from workbench.sites import KINDS, SITE_KINDS, expert_of, layer_of, site_id
from workbench.store import layout
from workbench.store.writer import SiteInfo, create_sites_group, update_manifest


@dataclass(frozen=True)
class LocalSite:
    kind: str
    name: str
    order: tuple[int, int, int, int, int]
    """(kind, stage, position seen, global expert, position seen): experts in global order across EP ranks."""
    shape: tuple[int, ...]
    dtype: str


class SiteRegistry:
    """Registers sites as they are first seen; ``build`` fixes them into ``sites`` (collective)."""

    def __init__(self, wanted: Callable[[str], bool], ranks: ParallelRanks) -> None:
        self._wanted = wanted
        self._ranks = ranks
        self._local: dict[str, LocalSite] = {}
        self._seen = 0
        self._expert_blocks: dict[tuple[str, str], int] = {}
        self.sites: list[str] | None = None
        """The run's sites in execution order, once built."""
        self.index: dict[str, int] = {}

    def register(self, kind: str, name: str, full_shape: tuple[int, ...], dtype: str,
                 position: int | None = None) -> str | None:
        """The site id if it is wanted (registering it on first sight), else None. ``position``: where the site
        stands among its kind's on this stage, if not where it was first seen (a parameter's place in the model:
        under the distributed optimizer a rank sees only the parameters it holds a shard of)."""
        site = site_id(kind, name)
        if not self._wanted(site):
            return None
        if site not in self._local:
            if self.sites is not None:
                raise RuntimeError(f"site {site} first appeared after the first recorded step; "
                                   "every recorded step must see the same sites")
            stage = -self._ranks.pp_rank if KINDS[kind].phase == "backward" else self._ranks.pp_rank
            expert = expert_of(name)
            # EP ranks see different experts at the same position: a layer's experts are ordered
            # by global index from the position where the first of them was seen.
            seen = self._seen if position is None else position
            block = seen if expert is None else \
                self._expert_blocks.setdefault((kind, name.partition(".experts.")[0]), seen)
            self._local[site] = LocalSite(kind, name, (SITE_KINDS.index(kind), stage, block, expert or 0, seen),
                                          full_shape, dtype)
            self._seen += 1
        return site

    def build(self, run_dir: Path, *, rank: int, steps: list[int], kinds: Iterable[str],
              optimizer_passed: bool, withheld: Mapping[str, str] | None = None) -> None:
        """Gather every rank's sites into ``sites`` (collective) and, on global rank 0, write the store's
        ``sites`` group for ``steps``; warn about (and note in the manifest) kinds no rank saw: ``withheld``'s
        with its reason (kinds the recorder does not record in this training), the others' likely one."""
        entries = [(site, s.kind, s.name, s.order, s.shape, s.dtype) for site, s in self._local.items()]
        best: dict[str, tuple[Any, ...]] = {}
        for entry in (e for rank_entries in all_gather_objects(entries) for e in rank_entries):
            if entry[0] not in best or entry[3] < best[entry[0]][3]:
                best[entry[0]] = entry
        ordered = sorted(best.values(), key=lambda e: (e[3], e[0]))
        self.sites = [e[0] for e in ordered]
        self.index = {site: i for i, site in enumerate(self.sites)}
        seen = {e[1] for e in ordered}
        withheld = withheld or {}
        missing = {kind: withheld.get(kind) or _why_missing(kind, optimizer_passed) for kind in kinds
                   if kind not in seen}
        if missing and rank == 0:
            warnings.warn("the recorder was asked for site kinds it never saw in the first recorded step: "
                          + "; ".join(f"{kind}: {why}" for kind, why in missing.items()), stacklevel=2)
            update_manifest(run_dir, kinds_missing=missing)
        if rank == 0:
            infos = [SiteInfo(site=e[0], kind=e[1], name=e[2], layer=_layer_number(e[2]), order=i,
                              shape="x".join(map(str, e[4])), dtype=e[5], numel=int(np.prod(e[4], dtype=np.int64)))
                     for i, e in enumerate(ordered)]
            if not _sites_group_matches(run_dir, steps, self.sites):
                create_sites_group(run_dir, steps, infos)


def _why_missing(kind: str, optimizer_passed: bool) -> str:
    """The likely reason that no site of ``kind`` was seen (the site filter may also exclude them all)."""
    if kind == "grad" and optimizer_passed:
        return "the optimizer's step did not run in the first recorded step, or no parameter had a gradient"
    return KINDS[kind].why_missing + " (or the site filter excludes all its sites)"


def _layer_number(name: str) -> int:
    """Global layer of a site name, -1 outside the transformer layers (the stored convention)."""
    layer = layer_of(name)
    return -1 if layer is None else layer


def _sites_group_matches(run_dir: Path, steps: list[int], registry: list[str]) -> bool:
    """True if the store already has a ``sites`` group for exactly these steps and sites (a resume)."""
    import zarr

    try:
        group = layout.subgroup(zarr.open_group(layout.RunPaths(run_dir).store, mode="r"), layout.SITES_GROUP)
        return (np.asarray(layout.array(group, layout.STEP_DIM)[:]).tolist() == steps
                and [str(s) for s in np.asarray(layout.array(group, layout.SITE_DIM)[:])] == registry)
    except DamagedStoreError:
        return False
